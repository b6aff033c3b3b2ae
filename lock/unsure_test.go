package lock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// heldRelease fails the release calls it is told to with an error whose
// outcome is unknown (a reply that timed out) and keeps the first one's
// arguments, so that the test can deliver that call later, as a copy
// delayed on the network would arrive.
type heldRelease struct {
	left atomic.Int32
	mu   sync.Mutex
	args []any
}

func (h *heldRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *heldRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *heldRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isRelease(cmd) && h.left.Add(-1) >= 0 {
			h.mu.Lock()
			if h.args == nil {
				h.args = append([]any{}, cmd.Args()...)
			}
			h.mu.Unlock()
			err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout (injected)")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// reentryAfterAnUnknownRelease takes the Mutex of c called name on srv,
// fails its final Unlock with an unknown outcome (and the retries in the
// background until the re-entry is answered), and re-enters it with
// reenter. The re-entry must be answered ErrReleased: the failed call may
// still land, and it removes the owner whatever count a re-entry gave it
// (the test delivers it then), so that other could take the lock while the
// owner's contexts are live. The retry in the background then finishes:
// the first context ends with ErrReleased, its Unlock returns nil, and
// other takes the lock.
func reentryAfterAnUnknownRelease(t *testing.T, srv *testenv.RedisServer, c, other *lock.Client, hook *heldRelease, name string, reenter func(ctx context.Context) (context.Context, error)) {
	t.Helper()
	bg := context.Background()
	direct := srv.Client()
	warm := c.Mutex(name + ":warm") // loads the release script on the server
	if w, err := warm.Lock(bg); err != nil || warm.Unlock(w) != nil {
		t.Fatal("warm-up", err)
	}
	m := c.Mutex(name)
	held, err := m.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	hook.left.Store(1 << 20) // the release and its retries in the background fail until the re-entry is answered
	if err := m.Unlock(held); err == nil {
		t.Fatal("the unlock reported success")
	}
	again, err := reenter(held)
	if err == nil {
		t.Fatalf("the re-entry of a hold whose failed release may still land succeeded (context live: %v): want ErrReleased", again.Err() == nil)
	}
	if !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("the re-entry: %v, want ErrReleased", err)
	}
	hook.mu.Lock()
	args := hook.args
	hook.mu.Unlock()
	// The failed call, on its way all along, lands now.
	if err := direct.Do(bg, args...).Err(); err != nil {
		t.Fatalf("delivering the delayed release: %v", err)
	}
	hook.left.Store(0)
	select {
	case <-held.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the retry in the background did not finish the release")
	}
	if cause := context.Cause(held); !errors.Is(cause, lock.ErrReleased) {
		t.Fatalf("the owner's context ended with %v, want ErrReleased", cause)
	}
	if err := m.Unlock(held); err != nil {
		t.Fatalf("the caller's retry of the Unlock after the retry in the background released it: %v, want nil", err)
	}
	got, err := other.Mutex(name).TryLock(bg, 0)
	if err != nil {
		t.Fatalf("another Client's TryLock after the release: %v", err)
	}
	other.Mutex(name).Unlock(got)
}

// unsureClient returns a Client of srv, retries off, whose releases hook
// fails, and another Client of srv.
func unsureClient(t *testing.T, srv *testenv.RedisServer, hook *heldRelease) (c, other *lock.Client) {
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	rdb.AddHook(hook)
	c = lock.New(rdb, lock.WithWatchdogTimeout(3*time.Second))
	t.Cleanup(func() { c.Close() })
	return c, instances(t, srv, 1)[0]
}

// A Mutex hold whose final Unlock failed with an unknown outcome is not
// re-entered: the re-entry answers ErrReleased and the retry in the
// background finishes the release.
func TestMutex_ReentryAfterAnUnknownReleaseOutcomeIsRefused(t *testing.T) {
	srv := testenv.Redis(t)
	hook := &heldRelease{}
	c, other := unsureClient(t, srv, hook)
	name := lockName(t)
	reentryAfterAnUnknownRelease(t, srv, c, other, hook, name, func(ctx context.Context) (context.Context, error) {
		return c.Mutex(name).Lock(ctx)
	})
}

// A MultiLock whose context carries a Mutex hold whose final Unlock failed
// with an unknown outcome answers ErrReleased, as the Mutex's own re-entry
// does, and takes none of its other locks.
func TestMultiLock_ReentryAfterAnUnknownReleaseOutcomeIsRefused(t *testing.T) {
	srv := testenv.Redis(t)
	hook := &heldRelease{}
	c, other := unsureClient(t, srv, hook)
	name := lockName(t)
	reentryAfterAnUnknownRelease(t, srv, c, other, hook, name, func(ctx context.Context) (context.Context, error) {
		return c.MultiLock(name, name+":b").TryLock(ctx, time.Second)
	})
	if got := srv.Do("EXISTS", name+":b"); got != int64(0) {
		t.Fatalf("the refused MultiLock left %s:b held", name)
	}
}

// A RedLock whose context carries a node's Mutex hold whose final Unlock
// failed with an unknown outcome answers ErrReleased too, and takes no
// other node.
func TestRedLock_ReentryAfterAnUnknownReleaseOutcomeIsRefused(t *testing.T) {
	nodes := redisNodes(t, 3)
	hook := &heldRelease{}
	c, other := unsureClient(t, nodes[0], hook)
	cs := []*lock.Client{c}
	for _, n := range nodes[1:] {
		cs = append(cs, instances(t, n, 1)[0])
	}
	name := lockName(t)
	reentryAfterAnUnknownRelease(t, nodes[0], c, other, hook, name, func(ctx context.Context) (context.Context, error) {
		return lock.NewRedLock(name, cs...).TryLock(ctx, time.Second)
	})
	for i, n := range nodes[1:] {
		if got := n.Do("EXISTS", name); got != int64(0) {
			t.Fatalf("the refused RedLock left %s held on node %d", name, i+1)
		}
	}
}

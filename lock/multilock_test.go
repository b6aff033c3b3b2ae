package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// heldCount counts, in one atomic step, how many of the lock keys exist.
var heldCount = redis.NewScript(`local n = 0
for _, k in ipairs(KEYS) do n = n + redis.call('exists', k) end
return n`)

func TestMultiLock_IsNeverSeenPartlyHeld(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	base := lockName(t)
	names := []string{base + ":stock", base + ":balance", base + ":coupon"}
	reversed := []string{names[2], names[1], names[0]}
	stop := make(chan struct{})
	var partial, whole, observations atomic.Int64
	observer := srv.Client()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := heldCount.Run(context.Background(), observer, names).Int()
			if err != nil {
				t.Error(err)
				return
			}
			observations.Add(1)
			switch n {
			case 0:
			case len(names):
				whole.Add(1)
			default:
				partial.Add(1)
			}
		}
	}()
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for i, c := range clients {
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ml := c.MultiLock(names...)
				if (i+g)%2 == 1 {
					ml = c.MultiLock(reversed...) // same set, other order: no deadlock
				}
				for r := 0; r < 10; r++ {
					ctx, err := ml.Lock(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					if err := ml.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	<-done
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d MultiLock holds overlapped", n)
	}
	if n := partial.Load(); n != 0 {
		t.Fatalf("observed the set partly held %d times in %d looks", n, observations.Load())
	}
	if whole.Load() == 0 {
		t.Fatal("never observed the set held: the observer saw nothing")
	}
	t.Logf("%d observations, %d with the whole set held, none partial", observations.Load(), whole.Load())
}

func TestMultiLock_AllOrNoneWhenOneIsTaken(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	base := lockName(t)
	a, b := base+":a", base+":b"
	held, err := cs[0].Mutex(b).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = cs[1].MultiLock(a, b).TryLock(context.Background(), 200*time.Millisecond)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if n := srv.Do("EXISTS", a); n != int64(0) {
		t.Fatal("a failed MultiLock left one of its locks held")
	}
	// Released b wakes a waiting MultiLock at once.
	got := make(chan error, 1)
	go func() {
		ctx, err := cs[1].MultiLock(a, b).Lock(context.Background())
		if err == nil {
			err = cs[1].MultiLock(b, a).Unlock(ctx)
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cs[0].Mutex(b).Unlock(held)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("waiting MultiLock not woken by the unlock")
	}
}

func TestMultiLock_OneTokenValidForEveryLock(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	base := lockName(t)
	a, b := base+":a", base+":b"
	// b's counter is far ahead of a's (and of the clock).
	srv.Do("SET", "redisson_lock_token:{"+b+"}", "8000000000000000")
	ctx, err := cs[0].MultiLock(a, b).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := fencing.FromContext(ctx)
	if !ok || tok <= 8000000000000000 {
		t.Fatalf("MultiLock token %d, want above every earlier token of its locks", tok)
	}
	if err := cs[0].MultiLock(a, b).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A later holder of a alone gets a larger token: a's counter was raised.
	la, err := cs[1].Mutex(a).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ta, _ := fencing.FromContext(la); ta <= tok {
		t.Fatalf("later token of %s = %d, not above the MultiLock's %d", a, ta, tok)
	}
	cs[1].Mutex(a).Unlock(la)
}

func TestMultiLock_ReentryAndMutexInterplay(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	base := lockName(t)
	a, b := base+":a", base+":b"
	outer, err := c.Mutex(a).Lock(context.Background()) // holds a already
	if err != nil {
		t.Fatal(err)
	}
	ml := c.MultiLock(a, b)
	m1, err := ml.Lock(outer) // re-enters a, takes b
	if err != nil {
		t.Fatal(err)
	}
	m2, err := ml.Lock(m1) // re-enters the MultiLock
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Mutex(a).HoldCount(m2); n != 3 {
		t.Fatalf("a held %d levels, want 3", n)
	}
	if err := ml.Unlock(m2); err != nil {
		t.Fatal(err)
	}
	if m1.Err() != nil {
		t.Fatal("inner unlock ended the MultiLock context")
	}
	if err := ml.Unlock(m1); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(m1), lock.ErrReleased) {
		t.Fatalf("MultiLock context cause %v, want ErrReleased", context.Cause(m1))
	}
	if n := srv.Do("EXISTS", b); n != int64(0) {
		t.Fatal("b still held")
	}
	if n, _ := c.Mutex(a).HoldCount(outer); n != 1 {
		t.Fatalf("a held %d levels after the MultiLock, want the Mutex's 1", n)
	}
	if err := ml.Unlock(m1); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second final Unlock = %v, want ErrNotHeld", err)
	}
	if err := c.Mutex(a).Unlock(outer); err != nil {
		t.Fatal(err)
	}
}

func TestMultiLock_LosingOneLockCancelsTheContext(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(600*time.Millisecond))[0]
	base := lockName(t)
	ml := c.MultiLock(base+":a", base+":b")
	ctx, err := ml.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Do("DEL", base+":b")
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("losing one lock did not cancel the MultiLock context")
	}
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", context.Cause(ctx))
	}
	if err := ml.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock = %v, want ErrLost", err)
	}
	if n := srv.Do("EXISTS", base+":a"); n != int64(0) {
		t.Fatal("the lock that was not lost is still held")
	}
}

func TestMultiLock_CrashedHolderSetIsTakenAfterTheLease(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(time.Second))
	base := lockName(t)
	names := []string{base + ":a", base + ":b", base + ":c"}
	if _, err := cs[0].MultiLock(names...).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	cs[0].Close()
	ctx, err := cs[1].MultiLock(names...).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(crashed); d > 2500*time.Millisecond {
		t.Fatalf("taken %v after the crash, want about the 1s lease", d)
	}
	cs[1].MultiLock(names...).Unlock(ctx)
}

func TestMultiLock_OneScriptPerAcquisitionOnOneNode(t *testing.T) {
	srv := testenv.Redis(t)
	sent := testenv.NewCommandCounter()
	rdb := srv.Client()
	rdb.AddHook(sent)
	c := lock.New(rdb)
	defer c.Close()
	names := make([]string, 5)
	for i := range names {
		names[i] = fmt.Sprintf("%s:%d", lockName(t), i)
	}
	ml := c.MultiLock(names...)
	warm, _ := ml.Lock(context.Background())
	ml.Unlock(warm)
	before := sent.Total()
	ctx, err := ml.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := sent.Total() - before; n != 2 {
		t.Fatalf("Lock+Unlock of 5 locks on one node sent %d commands, want 2 (%v)", n, sent)
	}
}

func TestMultiLock_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	var nilML *lock.MultiLock
	cases := map[string]func() error{
		"no names":        func() error { _, err := c.MultiLock().Lock(bg); return err },
		"an empty name":   func() error { _, err := c.MultiLock("a", "").Lock(bg); return err },
		"bad hash tag":    func() error { _, err := c.MultiLock("a", "b{").Lock(bg); return err },
		"negative wait":   func() error { _, err := c.MultiLock("a").TryLock(bg, -1); return err },
		"zero lease":      func() error { _, err := c.MultiLock("a").Lock(bg, lock.WithLease(0)); return err },
		"nil context":     func() error { _, err := c.MultiLock("a").Lock(nil); return err }, //nolint:staticcheck
		"nil multilock":   func() error { _, err := nilML.Lock(bg); return err },
		"nil neg wait":    func() error { _, err := nilML.TryLock(bg, -1); return err },
		"nil lock client": func() error { var nc *lock.Client; _, err := nc.MultiLock("a").Lock(bg); return err },
		"unlock nil ctx":  func() error { return c.MultiLock("a").Unlock(nil) }, //nolint:staticcheck
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if err := c.MultiLock("a").Unlock(bg); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Unlock without a hold = %v, want ErrNotHeld", err)
	}
	if n := srv.Do("DBSIZE"); n != int64(0) {
		t.Fatalf("bad input created %v keys", n)
	}
	// Duplicates are locked once.
	ctx, err := c.MultiLock("d", "d").Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Mutex("d").HoldCount(ctx); n != 1 {
		t.Fatalf("duplicate name held %d levels, want 1", n)
	}
	if err := c.MultiLock("d").Unlock(ctx); err != nil { // the same set
		t.Fatal(err)
	}
}

// A MultiLock that holds its locks re-enters them at once, even while
// goroutines of its own Client wait for them: a re-entry that queued behind
// those waiters would wait for itself (a Lock without a bound forever).
func TestMultiLock_ReentryDoesNotWaitBehindItsClientsWaiters(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	names := []string{lockName(t) + ":a", lockName(t) + ":b"}
	ml := c.MultiLock(names...)
	ctx, err := ml.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	waiters, cancel := context.WithCancel(bg)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range names { // another owner of the same Client waits for each lock
		wg.Add(1)
		go func() {
			defer wg.Done()
			if wctx, err := c.Mutex(n).Lock(waiters); err == nil {
				c.Mutex(n).Unlock(wctx)
			}
		}()
	}
	for _, n := range names {
		eventually(t, 2*time.Second, "a waiter subscribed to "+n, func() bool {
			v, _ := srv.Do("PUBSUB", "NUMSUB", "redisson_lock__channel:{"+n+"}").([]any)
			return len(v) == 2 && v[1] == int64(1)
		})
	}
	inner, err := ml.TryLock(ctx, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("re-entry with TryLock = %v, want it re-entered at once", err)
	}
	lctx, lcancel := context.WithTimeout(inner, 2*time.Second)
	defer lcancel()
	innermost, err := ml.Lock(lctx)
	if err != nil {
		t.Fatalf("re-entry with Lock = %v, want it re-entered at once", err)
	}
	// A set that adds a free lock to held ones waits, if at all, for that one.
	more := c.MultiLock(names[0], lockName(t)+":z")
	mctx, err := more.TryLock(innermost, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("re-entry of a held lock with a free one = %v, want both held at once", err)
	}
	for _, c2 := range []context.Context{mctx, innermost, inner, ctx} {
		set := ml
		if c2 == mctx {
			set = more
		}
		if err := set.Unlock(c2); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait() // the waiters got their locks in turn
}

// lockResult is what lockAsync reports.
type lockResult struct {
	ctx context.Context
	err error
}

// lockAsync locks m in a goroutine of its own and reports the outcome.
func lockAsync(m *lock.Mutex) <-chan lockResult {
	out := make(chan lockResult, 1)
	go func() {
		ctx, err := m.Lock(context.Background())
		out <- lockResult{ctx, err}
	}()
	return out
}

package lock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// lostReplies is a go-redis hook that lets matching commands run on the
// server and then throws their replies away, as a connection that breaks
// after the request was sent would.
type lostReplies struct {
	match func(redis.Cmder) bool
	left  atomic.Int32 // how many replies still to lose
}

func (h *lostReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lostReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.match(cmd) && h.left.Add(-1) >= 0 {
			err = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer (injected)")}
			cmd.SetErr(err)
		}
		return err
	}
}

// scriptCall matches calls of a script whose second key starts with prefix.
func scriptCall(prefix string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		args := cmd.Args()
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" || len(args) < 5 {
			return false
		}
		key, _ := args[4].(string)
		return strings.HasPrefix(key, prefix)
	}
}

// isRelease matches the release script (its keys: the lock and its channel).
var isRelease = scriptCall("redisson_lock__channel:")

func TestFaults_UnlockRetriedAfterLostReplyReleasesOneLevel(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	hook := &lostReplies{match: isRelease}
	rdb.AddHook(hook)
	c := lock.New(rdb)
	defer c.Close()
	m := c.Mutex(lockName(t))
	outer, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.Lock(outer)
	if err != nil {
		t.Fatal(err)
	}
	hook.left.Store(1)
	if err := m.Unlock(inner); err == nil {
		t.Fatal("unlock with a lost reply reported success")
	}
	if n, _ := m.HoldCount(outer); n != 1 {
		t.Fatalf("hold count after the lost-reply unlock = %d, want 1 (it was applied)", n)
	}
	if err := m.Unlock(inner); err != nil { // the retry
		t.Fatalf("retried unlock = %v", err)
	}
	if n, _ := m.HoldCount(outer); n != 1 {
		t.Fatalf("hold count after the retry = %d, want still 1: a level was released twice", n)
	}
	// The final level: its reply lost too, then retried.
	hook.left.Store(1)
	if err := m.Unlock(outer); err == nil {
		t.Fatal("final unlock with a lost reply reported success")
	}
	if err := m.Unlock(outer); err != nil {
		t.Fatalf("retried final unlock = %v, want success", err)
	}
	if locked, _ := m.IsLocked(context.Background()); locked {
		t.Fatal("lock still held")
	}
}

func TestFaults_AcquireWithLostReplyDoesNotLeaveTheLockHeld(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	hook := &lostReplies{match: scriptCall("redisson_lock_token:")}
	rdb.AddHook(hook)
	c := lock.New(rdb)
	defer c.Close()
	m := c.Mutex(lockName(t))
	hook.left.Store(1)
	if _, err := m.Lock(context.Background()); err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Lock with a lost reply = %v, want the network error", err)
	}
	if locked, _ := m.IsLocked(context.Background()); locked {
		t.Fatal("an acquisition nobody knows of keeps the lock held")
	}
}

func TestFaults_RedisDownIsAnErrorNotBusy(t *testing.T) {
	srv := testenv.Redis(t)
	c := lock.New(srv.Client(func(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 200 * time.Millisecond }))
	defer c.Close()
	srv.Kill()
	_, err := c.Mutex(lockName(t)).TryLock(context.Background(), time.Second)
	if err == nil || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock with Redis down = %v, want a connection error, not ErrNotAcquired", err)
	}
}

func TestFaults_WaiterRecoversWhenRedisRestarts(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(900*time.Millisecond))
	name := lockName(t)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, err := cs[1].Mutex(name).TryLock(context.Background(), 10*time.Second)
		if err == nil {
			cs[1].Mutex(name).Unlock(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	srv.Restart() // no persistence: the lock and the subscription are gone
	select {
	case <-held.Done():
		if !errors.Is(context.Cause(held), lock.ErrLost) {
			t.Fatalf("holder cause = %v", context.Cause(held))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the holder did not learn that its lock vanished with the restart")
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter after the restart: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter never acquired after the restart")
	}
}

func TestFaults_FailedFinalUnlockIsRetriedNotRenewed(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	hook := &lostReplies{match: isRelease}
	rdb.AddHook(hook)
	c := lock.New(rdb, lock.WithWatchdogTimeout(time.Second))
	defer c.Close()
	m := c.Mutex(lockName(t))
	ctx, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hook.left.Store(1)
	if err := m.Unlock(ctx); err == nil {
		t.Fatal("unlock with a lost reply reported success")
	}
	// Nobody retries (as guard does not): the lock must be free well before
	// the Client would close, and never renewed meanwhile.
	eventually(t, 2*time.Second, "the failed unlock is completed in the background", func() bool {
		locked, _ := m.IsLocked(context.Background())
		return !locked && ctx.Err() != nil
	})
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("a late retry of the failed unlock = %v, want success", err)
	}
}

func TestFaults_FailedFinalUnlockOfAnUnreachableRedisExpiresWithItsLease(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 100 * time.Millisecond })
	c := lock.New(rdb, lock.WithWatchdogTimeout(600*time.Millisecond))
	defer c.Close()
	m := c.Mutex(lockName(t))
	ctx, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause() // unreachable: the release waits for go-redis' read timeout, and so does every retry
	defer srv.Resume()
	if err := m.Unlock(ctx); err == nil {
		t.Fatal("unlock with Redis paused reported success")
	}
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), lock.ErrLost) {
			t.Fatalf("cause %v, want ErrLost once the lease ran out", context.Cause(ctx))
		}
	case <-time.After(6 * time.Second):
		t.Fatal("a hold whose release failed was kept past its lease")
	}
}

// refusedCalls is a go-redis hook that fails matching commands without
// sending them, as a connection that breaks before the request leaves does.
type refusedCalls struct {
	match func(redis.Cmder) bool
	left  atomic.Int32
	dial  bool // fail as a connection that could not be made: an outcome known, nothing sent
}

func (h *refusedCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refusedCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refusedCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) && h.left.Add(-1) >= 0 {
			err := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("broken pipe (injected)")}
			if h.dial {
				err = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused (injected)")}
			}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A hold whose final Unlock failed without being applied (no connection)
// is re-entered: the owner keeps it, and the watchdog renews it again. (One
// whose release failed with an unknown outcome is not: see
// TestMutex_ReentryAfterAnUnknownReleaseOutcomeIsRefused.)
func TestFaults_LockingAgainAfterAFailedUnlockIsRenewedAgain(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	hook := &refusedCalls{match: isRelease, dial: true}
	rdb.AddHook(hook)
	c := lock.New(rdb, lock.WithWatchdogTimeout(300*time.Millisecond))
	defer c.Close()
	m := c.Mutex(lockName(t))
	ctx, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hook.left.Store(1)
	if err := m.Unlock(ctx); err == nil {
		t.Fatal("an unlock that never left reported success")
	}
	again, err := m.Lock(ctx) // the owner keeps the lock after all
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // five leases
	if again.Err() != nil {
		t.Fatalf("lost: %v", context.Cause(again))
	}
	if n, _ := m.HoldCount(again); n != 2 {
		t.Fatalf("hold count %d, want 2 (the watchdog must renew the lock again)", n)
	}
	if err := m.Unlock(again); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A MultiLock whose final Unlock failed (its reply lost) is released in the
// background; the caller's own retry, arriving after that, succeeds as a
// Mutex's does: the set was released, nothing was lost.
func TestFaults_MultiLockUnlockRetriedAfterItsBackgroundRetrySucceeds(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	hook := &lostReplies{match: isRelease}
	rdb.AddHook(hook)
	c := lock.New(rdb, lock.WithWatchdogTimeout(time.Second))
	defer c.Close()
	base := lockName(t)
	ml := c.MultiLock(base+":a", base+":b")
	ctx, err := ml.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hook.left.Store(1)
	if err := ml.Unlock(ctx); err == nil {
		t.Fatal("unlock with a lost reply reported success")
	}
	eventually(t, 2*time.Second, "the failed unlock is completed in the background", func() bool {
		return srv.Do("EXISTS", base+":a", base+":b") == int64(0) && ctx.Err() != nil
	})
	if err := ml.Unlock(ctx); err != nil {
		t.Fatalf("a late retry of the failed unlock = %v, want success", err)
	}
	if err := ml.Unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("one more unlock = %v, want ErrNotHeld", err)
	}
}

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

func TestWatchdog_KeepsLockPastItsTimeout(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(600*time.Millisecond))
	name := lockName(t)
	ctx, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if ctx.Err() != nil {
		t.Fatalf("hold ended after 3s: %v", context.Cause(ctx))
	}
	if _, err := cs[1].Mutex(name).TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another client could lock after 3s of a renewed hold: %v", err)
	}
	if ttl, _ := cs[0].Mutex(name).TTL(context.Background()); ttl <= 0 || ttl > 600*time.Millisecond {
		t.Fatalf("TTL = %v, want within the 600ms watchdog timeout", ttl)
	}
	if err := cs[0].Mutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWatchdog_TimeoutIsTheLeaseOfALockWithoutWithLease(t *testing.T) {
	srv := testenv.Redis(t)
	if d := instances(t, srv, 1)[0].WatchdogTimeout(); d != lock.DefaultWatchdogTimeout {
		t.Fatalf("WatchdogTimeout() = %v without the option, want DefaultWatchdogTimeout", d)
	}
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(700*time.Millisecond))[0]
	if d := c.WatchdogTimeout(); d != 700*time.Millisecond {
		t.Fatalf("WatchdogTimeout() = %v, want 700ms", d)
	}
	ctx, err := c.Mutex(lockName(t)).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Mutex(lockName(t)).Unlock(ctx)
	if ttl, _ := c.Mutex(lockName(t)).TTL(context.Background()); ttl <= 0 || ttl > c.WatchdogTimeout() {
		t.Fatalf("TTL = %v, want within WatchdogTimeout() %v", ttl, c.WatchdogTimeout())
	}
}

func TestWatchdog_FixedLeaseExpiresAndCancelsContext(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(600*time.Millisecond))[0]
	name := lockName(t)
	start := time.Now()
	ctx, err := c.Mutex(name).Lock(context.Background(), lock.WithLease(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	// Never before the lease; the upper bound only leaves room for a loaded machine.
	if d := time.Since(start); d < 450*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("fixed-lease context ended after %v, want about 500ms", d)
	}
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(ctx))
	}
	eventually(t, time.Second, "the key expires with its lease", func() bool {
		locked, _ := c.Mutex(name).IsLocked(context.Background())
		return !locked
	})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("key gone only after %v: something renewed a fixed lease", d)
	}
	if err := c.Mutex(name).Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("unlock after the lease ran out = %v, want ErrLost", err)
	}
}

func TestWatchdog_DeletedLockCancelsContextWithinOnePeriod(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(600*time.Millisecond))[0]
	name := lockName(t)
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	srv.Do("DEL", name)
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("deleting the lock did not cancel its context")
	}
	// One renewal period (200ms), plus room for a loaded machine.
	t.Logf("loss noticed %v after the lock was deleted", time.Since(deleted))
	if d := time.Since(deleted); d > 600*time.Millisecond {
		t.Fatalf("loss noticed after %v, want within one renewal period (200ms)", d)
	}
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(ctx))
	}
	if err := c.Mutex(name).Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("unlock of a lost lock = %v, want ErrLost", err)
	}
	// The owner can take the lock afresh.
	again, err := c.Mutex(name).TryLock(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Mutex(name).Unlock(again)
}

func TestWatchdog_ForceUnlockIsAnnouncedToTheHolder(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(600*time.Millisecond))
	name := lockName(t)
	ctx, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cs[1].Mutex(name).ForceUnlock(context.Background()); !ok || err != nil {
		t.Fatalf("ForceUnlock = %v, %v", ok, err)
	}
	eventually(t, time.Second, "holder learns of the forced unlock", func() bool { return ctx.Err() != nil })
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause = %v", context.Cause(ctx))
	}
}

func TestWatchdog_CrashedHolderLockExpiresAndIsTaken(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(600*time.Millisecond))
	name := lockName(t)
	if _, err := cs[0].Mutex(name).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // renewed at least once
	crashed := time.Now()
	cs[0].Close() // stops renewing without unlocking, as a dead process would
	ctx, err := cs[1].Mutex(name).TryLock(context.Background(), 3*time.Second)
	if err != nil {
		t.Fatalf("the crashed holder's lock was not taken: %v", err)
	}
	if d := time.Since(crashed); d > 2*time.Second {
		t.Fatalf("taken %v after the crash, want within the 600ms watchdog timeout", d)
	}
	cs[1].Mutex(name).Unlock(ctx)
}

func TestWatchdog_NoRenewalAfterFinalUnlock(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(300*time.Millisecond))[0]
	name := lockName(t)
	rdb := srv.Client()
	for i := 0; i < 20; i++ {
		ctx, err := c.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%4) * 40 * time.Millisecond)
		if err := c.Mutex(name).Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := commandCalls(t, rdb)
	time.Sleep(500 * time.Millisecond) // more than one renewal period
	d := delta(before, commandCalls(t, rdb))
	delete(d, "info")
	if len(d) != 0 {
		t.Fatalf("commands after every lock was released: %v", d)
	}
}

func TestWatchdog_RenewsManyLocksInBatches(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(900*time.Millisecond))[0]
	rdb := srv.Client()
	const n = 2000
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctx, err := c.Mutex(fmt.Sprintf("%s:%d", lockName(t), i)).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctxs[i] = ctx
	}
	before := commandCalls(t, rdb)
	time.Sleep(1200 * time.Millisecond) // four periods of 300ms
	d := delta(before, commandCalls(t, rdb))
	// 2000 locks = 4 script calls of 512 per period; about 4 periods (fewer
	// on a loaded machine). Locks taken over more than half a period are
	// not all due in the same pass, so a pass may split them into one more
	// call on each side: up to twice as many. One call per lock would be
	// thousands.
	if d["evalsha"] > 2*4*5 || d["evalsha"] < 4 {
		t.Fatalf("renewal calls in 1.2s = %d, want about 16 (4 batched calls per period)", d["evalsha"])
	}
	for i, ctx := range ctxs {
		if ctx.Err() != nil {
			t.Fatalf("lock %d lost: %v", i, context.Cause(ctx))
		}
		if err := c.Mutex(fmt.Sprintf("%s:%d", lockName(t), i)).Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// slowPipelines delays every pipelined round trip, as a busy Redis or a
// crowded connection pool would.
type slowPipelines struct{ delay atomic.Int64 }

func (h *slowPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *slowPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *slowPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(time.Duration(h.delay.Load()))
		return next(ctx, cmds)
	}
}

func TestWatchdog_RenewalsSlowerThanAPeriodKeepTheLocks(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	slow := new(slowPipelines)
	rdb.AddHook(slow)
	c := lock.New(rdb, lock.WithWatchdogTimeout(600*time.Millisecond))
	defer c.Close()
	var ctxs []context.Context
	for i := 0; i < 50; i++ {
		ctx, err := c.Mutex(fmt.Sprintf("%s:%d", lockName(t), i)).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctxs = append(ctxs, ctx)
	}
	time.Sleep(300 * time.Millisecond) // a first renewal loads the script
	// Period 200ms: from now on every renewal round trip takes longer.
	slow.delay.Store(int64(250 * time.Millisecond))
	time.Sleep(2 * time.Second)
	for i, ctx := range ctxs {
		if ctx.Err() != nil {
			t.Fatalf("lock %d lost although every renewal succeeded, only slowly: %v", i, context.Cause(ctx))
		}
	}
}

// stuckPipelines holds every pipelined round trip back while stuck is set,
// as a network that silently drops packets does: the caller waits for its
// read timeout, which go-redis does not shorten to a lease.
type stuckPipelines struct{ stuck atomic.Bool }

func (h *stuckPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *stuckPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *stuckPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.stuck.Load() {
			select {
			case <-time.After(10 * time.Second):
			case <-ctx.Done():
			}
			return context.DeadlineExceeded
		}
		return next(ctx, cmds)
	}
}

func TestWatchdog_CutOffHolderIsToldWhenItsLeaseEnds(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	stuck := new(stuckPipelines)
	rdb.AddHook(stuck)
	c := lock.New(rdb, lock.WithWatchdogTimeout(600*time.Millisecond))
	defer c.Close()
	ctx, err := c.Mutex(lockName(t)).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // renewed once at least
	cut := time.Now()
	stuck.stuck.Store(true)
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a holder whose renewals hang was not told its lease ran out")
	}
	// The lease was last renewed at most a period before the cut.
	if d := time.Since(cut); d > 600*time.Millisecond+300*time.Millisecond {
		t.Fatalf("told %v after the cut, want by the end of its 600ms lease", d)
	}
	if !errors.Is(context.Cause(ctx), lock.ErrLost) {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}

// A hold cut off from Redis right after it was taken, by a network that
// drops every packet, is told by the end of its lease, measured from the
// start of its acquisition: before another Client can get the lock. Its
// watchdog pass hangs until go-redis gives up; the lease deadline must not
// wait for it, even for the first hold of a Client (whose watchdog loop
// starts with it) and for a hold taken after the previous one was released.
func TestWatchdog_FreshHoldCutOffIsToldByItsLeaseEnd(t *testing.T) {
	const timeout = time.Second
	srv := testenv.Redis(t)
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	name := lockName(t)
	other := instances(t, srv, 1, lock.WithWatchdogTimeout(timeout))[0]
	for _, round := range []string{"first hold of the Client", "hold after a release"} {
		p.SetBlackhole(false)
		c := lock.New(redis.NewClient(&redis.Options{Addr: p.Addr}), lock.WithWatchdogTimeout(timeout))
		if round != "first hold of the Client" {
			// The watchdog has run and stopped with nothing held.
			ctx, err := c.Mutex(name + ":warm").Lock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(timeout / 2) // a renewal pass
			if err := c.Mutex(name + ":warm").Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(timeout / 2) // a pass that finds nothing held
		}
		start := time.Now()
		ctx, err := c.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.SetBlackhole(true)
		octx, err := other.Mutex(name).TryLock(context.Background(), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: the other Client never got the lock: %v", round, err)
		}
		in := time.Since(start)
		t.Logf("%s: the other Client got in after %v", round, in.Round(time.Millisecond))
		if ctx.Err() == nil {
			<-ctx.Done()
			t.Fatalf("%s: the cut-off holder was told after %v, after the other Client got in at %v (lease %v)",
				round, time.Since(start).Round(time.Millisecond), in.Round(time.Millisecond), timeout)
		}
		if !errors.Is(context.Cause(ctx), lock.ErrLost) {
			t.Fatalf("%s: cause %v, want ErrLost", round, context.Cause(ctx))
		}
		other.Mutex(name).Unlock(octx)
		p.SetBlackhole(false)
		c.Close()
	}
}

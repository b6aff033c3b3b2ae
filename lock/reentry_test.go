package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A MultiLock taken with a context that holds several of its names adds a
// level to each of those holds; when the MultiLock's own context ends, every
// one of those levels goes with it, so that the holders' Unlocks release the
// locks in the end and nothing is left in Redis or in the Client.
func TestReentry_MultiLockOverHeldMutexReleasesEveryLevel(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	a, b, d := c.Mutex(name+":a"), c.Mutex(name+":b"), c.Mutex(name+":c")
	bg := context.Background()
	ctxA, err := a.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	ctxB, err := b.Lock(ctxA)
	if err != nil {
		t.Fatal(err)
	}
	ctxD, err := d.Lock(ctxB)
	if err != nil {
		t.Fatal(err)
	}
	call, cancel := context.WithCancel(ctxD)
	ml := c.MultiLock(name+":a", name+":b", name+":c")
	mctx, err := ml.Lock(call)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*lock.Mutex{a, b, d} {
		if n, err := m.HoldCount(mctx); n != 2 || err != nil {
			t.Fatalf("%s under the MultiLock: HoldCount %d, %v; want 2", m.Name(), n, err)
		}
	}
	cancel() // the MultiLock's context ends: its levels go
	eventually(t, 2*time.Second, "the MultiLock's context ended", func() bool { return mctx.Err() != nil })
	deadline := time.Now().Add(2 * time.Second)
	for _, m := range []*lock.Mutex{a, b, d} {
		for {
			n, err := m.HoldCount(ctxD)
			if err == nil && n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: HoldCount %d, %v 2s after the MultiLock's context ended; want 1 (the MultiLock's level released)", m.Name(), n, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := ml.Unlock(mctx); err != nil {
		t.Fatalf("MultiLock Unlock after its context ended: %v; want nil", err)
	}
	for _, step := range []struct {
		m   *lock.Mutex
		ctx context.Context
	}{{d, ctxD}, {b, ctxB}, {a, ctxA}} {
		if err := step.m.Unlock(step.ctx); err != nil {
			t.Fatalf("%s: Unlock: %v", step.m.Name(), err)
		}
		if n, err := step.m.HoldCount(step.ctx); n != 0 || err != nil {
			t.Fatalf("%s: HoldCount after its final Unlock = %d, %v; want 0", step.m.Name(), n, err)
		}
		if ok, err := step.m.IsLocked(bg); ok || err != nil {
			t.Fatalf("%s: still locked after its final Unlock (%v)", step.m.Name(), err)
		}
	}
	eventually(t, time.Second, "the Client forgets every hold", func() bool { return lock.HoldsOf(c) == 0 })
}

// The same with fixed leases (WithLease): a MultiLock over held Mutexes, its
// context ended, must leave no level behind, or the hold it kept stays
// registered in the Client as held long after its lease emptied Redis.
func TestReentry_WithLeaseUnderAMultiLockLeavesNothingBehind(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	ml := c.MultiLock(name+":a", name+":b")
	order := ml.Names() // the order the MultiLock takes them in
	// The hold taken first, with the request's context, is the one the
	// MultiLock comes to last; the other ends with it.
	first, second := c.Mutex(order[1]), c.Mutex(order[0])
	lease := lock.WithLease(400 * time.Millisecond)
	ctx1, err := first.Lock(context.Background(), lease)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, err := second.Lock(ctx1, lease)
	if err != nil {
		t.Fatal(err)
	}
	call, cancel := context.WithCancel(ctx2)
	mctx, err := ml.Lock(call, lease)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	eventually(t, time.Second, "the MultiLock's context ended", func() bool { return mctx.Err() != nil })
	time.Sleep(50 * time.Millisecond) // its levels are released in the background
	if err := second.Unlock(ctx2); err != nil {
		t.Fatalf("%s: Unlock: %v", second.Name(), err)
	}
	if err := first.Unlock(ctx1); err != nil {
		t.Fatalf("%s: Unlock: %v", first.Name(), err)
	}
	time.Sleep(600 * time.Millisecond) // past every lease
	if n := lock.HoldsOf(c); n != 0 {
		t.Fatalf("after every Unlock and past every lease the Client keeps %d hold(s) %v; want none", n, lock.DescribeHolds(c))
	}
}

// A re-entry WithLease extends a fixed hold; Unlocks before its lease runs
// out release every level, and after it has run out they answer ErrLost and
// leave nothing behind either.
func TestReentry_WithLeaseReleasesEveryLevel(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	bg := context.Background()
	for _, runOut := range []bool{false, true} {
		ctx, err := m.Lock(bg, lock.WithLease(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		rctx, err := m.Lock(ctx, lock.WithLease(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if runOut {
			time.Sleep(400 * time.Millisecond)
			if !errors.Is(context.Cause(ctx), lock.ErrLost) {
				t.Fatalf("the hold's context after its lease ran out: %v; want ErrLost", context.Cause(ctx))
			}
		}
		errR, errO := m.Unlock(rctx), m.Unlock(ctx)
		if runOut && (!errors.Is(errR, lock.ErrLost) || !errors.Is(errO, lock.ErrLost)) {
			t.Fatalf("Unlocks after the lease ran out: %v, %v; want ErrLost", errR, errO)
		}
		if !runOut && (errR != nil || errO != nil) {
			t.Fatalf("Unlocks: %v, %v", errR, errO)
		}
		if n, err := m.HoldCount(ctx); n != 0 || err != nil {
			t.Fatalf("HoldCount after the final Unlock = %d, %v; want 0", n, err)
		}
		if ok, _ := m.IsLocked(bg); ok {
			t.Fatal("still locked after the final Unlock")
		}
		if n := lock.HoldsOf(c); n != 0 {
			t.Fatalf("the Client keeps %d hold(s) %v; want none", n, lock.DescribeHolds(c))
		}
	}
}

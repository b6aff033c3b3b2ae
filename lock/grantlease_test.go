package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// handedLate hands m's lock from a holder to a waiter of the same Client
// whose goroutine wakes only after stall, and checks what its Lock returns:
// an error, or a lock Redis still holds for it with a lease left, which
// another Client cannot take. kept requires the lock the handover gave (the
// next token), held all along, rather than one taken afresh.
func handedLate(t *testing.T, srv *testenv.RedisServer, c, other *lock.Client, stall time.Duration, kept bool, opts ...lock.LockOption) {
	t.Helper()
	name := lockName(t)
	m := c.Mutex(name)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan struct{})
	defer lock.DelayGrants(func() {
		time.Sleep(stall)
		close(woke)
	})()
	type result struct {
		ctx context.Context
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, err := m.Lock(context.Background(), opts...)
		got <- result{ctx, err}
	}()
	time.Sleep(100 * time.Millisecond) // let it try, subscribe and queue
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if kept {
		first, _ := fencing.FromContext(held)
		if r.err != nil {
			t.Fatalf("Lock of the waiter handed the lock: %v", r.err)
		}
		if tok, _ := fencing.FromContext(r.ctx); tok != first+1 {
			t.Errorf("the waiter holds token %d, not the handover's %d: its lease ran out before its goroutine ran (woken %v after the handover), and it acquired afresh", tok, first+1, stall)
		}
	}
	select {
	case <-woke:
	default:
		t.Fatal("the waiter was not handed the lock")
	}
	if r.err != nil {
		t.Logf("Lock after a late wake-up: %v", r.err)
		return
	}
	defer m.Unlock(r.ctx)
	if r.ctx.Err() != nil {
		t.Errorf("Lock succeeded with a context already ended: %v", context.Cause(r.ctx))
	}
	rdb := srv.Client()
	if n, pttl := rdb.HLen(context.Background(), name).Val(), rdb.PTTL(context.Background(), name).Val(); n != 1 || pttl <= 0 {
		t.Errorf("Lock succeeded (woken %v after the handover), but the lock hash has %d fields and PTTL %v", stall, n, pttl)
	}
	if _, err := other.Mutex(name).TryLock(context.Background(), 0); err == nil {
		t.Fatalf("another Client took the lock that Lock had just returned as held (woken %v after the handover)", stall)
	}
	if r.ctx.Err() != nil {
		t.Fatalf("Lock succeeded with a lock already lost: %v", context.Cause(r.ctx))
	}
}

// A waiter handed the lock is renewed from the handover on, not from when
// its goroutine runs: woken after twice the watchdog timeout, it still
// holds the lock (or is told it does not).
func TestHandover_AWaiterWokenLateIsRenewedFromTheHandover(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(300*time.Millisecond))
	handedLate(t, srv, cs[0], cs[1], 700*time.Millisecond, true)
}

// A waiter handed the lock with a fixed lease that ran out before its
// goroutine woke is not told it holds it.
func TestHandover_AWaiterWokenAfterItsFixedLeaseDoesNotHoldIt(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	handedLate(t, srv, cs[0], cs[1], 500*time.Millisecond, false, lock.WithLease(200*time.Millisecond))
}

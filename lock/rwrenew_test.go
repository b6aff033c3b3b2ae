package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A downgrade's read hold, under a write hold the watchdog renews, stays
// held past a watchdog timeout: its renewal extends the readers' set that
// holds its lease even while the write hold's renewals keep the lock hash
// alive.
func TestRWMutex_DowngradeUnderARenewedWriteLockStaysHeld(t *testing.T) {
	srv := testenv.Redis(t)
	const timeout = 600 * time.Millisecond
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(timeout))[0]
	rw := c.RWMutex(lockName(t))
	wctx, err := rw.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := rw.RLock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout)
	if rctx.Err() != nil {
		t.Fatalf("the read hold ended %v into a watchdog hold: %v", 2*timeout, context.Cause(rctx))
	}
	if err := rw.RUnlock(rctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
	if err := rw.Unlock(wctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

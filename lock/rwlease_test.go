package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// rwStillExcludes checks that another Client can take neither side of rw's
// lock and that ctx, a hold of it, has not ended.
func rwStillExcludes(t *testing.T, other *lock.RWMutex, ctx context.Context, what string) {
	t.Helper()
	if ctx.Err() != nil {
		t.Fatalf("%s: the hold's context ended: %v", what, context.Cause(ctx))
	}
	bg := context.Background()
	if rctx, err := other.TryRLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		if err == nil {
			_ = other.RUnlock(rctx)
		}
		t.Fatalf("%s: another Client's TryRLock = %v; want ErrNotAcquired", what, err)
	}
	if wctx, err := other.TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		if err == nil {
			_ = other.Unlock(wctx)
		}
		t.Fatalf("%s: another Client's TryLock = %v; want ErrNotAcquired", what, err)
	}
}

// A downgrade's read hold with a lease shorter than the write hold's leaves
// the write hold its own lease: the lock hash they share must not expire
// with the shorter one while the writer still holds.
func TestRWMutex_DowngradeWithAShortLeaseKeepsTheWriteLock(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	rw := cs[0].RWMutex(name)
	wctx, err := rw.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := rw.RLock(wctx, lock.WithLease(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the read lease ran out
	if rctx.Err() == nil {
		t.Fatal("the read hold outlived its lease")
	}
	rwStillExcludes(t, cs[1].RWMutex(name), wctx, "the write hold after its downgrade's lease ran out")
	if err := rw.Unlock(wctx); err != nil {
		t.Fatalf("write Unlock: %v", err)
	}
}

// A write re-entry with a short lease weakens neither the write hold, which
// the watchdog keeps renewing, nor the owner's read hold (a downgrade),
// which keeps its own lease.
func TestRWMutex_WriteReentryWithAShortLeaseWeakensNeitherHold(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(600*time.Millisecond))
	name := lockName(t)
	rw := cs[0].RWMutex(name)
	wctx, err := rw.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := rw.RLock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := rw.Lock(wctx, lock.WithLease(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // past the re-entry's lease and a watchdog timeout
	rwStillExcludes(t, cs[1].RWMutex(name), w2, "the write hold after its re-entry's short lease")
	if rctx.Err() != nil {
		t.Fatalf("the read hold ended: %v", context.Cause(rctx))
	}
	if err := rw.Unlock(w2); err != nil {
		t.Fatalf("write Unlock: %v", err)
	}
	if err := rw.Unlock(wctx); err != nil {
		t.Fatalf("write Unlock: %v", err)
	}
	other := cs[1].RWMutex(name)
	if wctx2, err := other.TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		if err == nil {
			_ = other.Unlock(wctx2)
		}
		t.Fatalf("another Client's TryLock beside a live read hold = %v; want ErrNotAcquired", err)
	}
	if err := rw.RUnlock(rctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
}

// A write hold taken WithLease whose owner downgrades ends in Redis with its
// lease, whatever the read hold does: once the write hold's context was told
// (ErrLost), its write field and the "write" mode go, so other Clients'
// readers get in beside the downgraded reader, which lives on.
func TestRWMutex_WriteLeaseEndRemovesTheWriteHoldUnderADowngrade(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(900*time.Millisecond))
	name := lockName(t)
	rw := cs[0].RWMutex(name)
	bg := context.Background()
	wctx, err := rw.Lock(bg, lock.WithLease(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := rw.RLock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-wctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the write hold outlived its lease")
	}
	if !errors.Is(context.Cause(wctx), lock.ErrLost) {
		t.Fatalf("the write hold ended with %v; want ErrLost", context.Cause(wctx))
	}
	other := cs[1].RWMutex(name)
	var got error
	deadline := time.Now().Add(time.Second)
	for {
		var octx context.Context
		if octx, got = other.TryRLock(bg, 0); got == nil {
			_ = other.RUnlock(octx)
			break
		}
		if time.Now().After(deadline) {
			fields, _ := srv.Client().HGetAll(bg, name).Result()
			t.Fatalf("another Client's reader, a second after the write hold's lease ended: %v; the lock hash holds %v", got, fields)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if mode, _ := srv.Client().HGet(bg, name, "mode").Result(); mode != "read" {
		t.Fatalf("mode %q beside the downgraded reader; want read", mode)
	}
	if rctx.Err() != nil {
		t.Fatalf("the downgraded read hold ended with the write hold: %v", context.Cause(rctx))
	}
	if err := rw.RUnlock(rctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
}

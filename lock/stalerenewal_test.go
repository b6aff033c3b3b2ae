package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A watchdog renewal sent before a re-entry fixed the hold's lease
// (WithLease) and delivered after it must not stretch the new lease to the
// watchdog's: the lock ends when the new lease does. For every kind the
// watchdog renews with renew.lua.
func TestWatchdog_StaleRenewalDoesNotStretchAJustFixedLease(t *testing.T) {
	type locker func(c *lock.Client, name string) func(context.Context, ...lock.LockOption) (context.Context, error)
	for _, k := range []struct {
		kind string
		lock locker
	}{
		{"Mutex", func(c *lock.Client, name string) func(context.Context, ...lock.LockOption) (context.Context, error) {
			return c.Mutex(name).Lock
		}},
		{"FairMutex", func(c *lock.Client, name string) func(context.Context, ...lock.LockOption) (context.Context, error) {
			return c.FairMutex(name).Lock
		}},
		{"RWMutex write", func(c *lock.Client, name string) func(context.Context, ...lock.LockOption) (context.Context, error) {
			return c.RWMutex(name).Lock
		}},
	} {
		t.Run(k.kind, func(t *testing.T) { staleRenewalAfterFix(t, k.lock) })
	}
}

func staleRenewalAfterFix(t *testing.T, locker func(c *lock.Client, name string) func(context.Context, ...lock.LockOption) (context.Context, error)) {
	srv := testenv.Redis(t)
	p, rdb := proxied(t, srv)
	c := lock.New(rdb, lock.WithWatchdogTimeout(1500*time.Millisecond)) // renewals every 500 ms
	t.Cleanup(func() { c.Close() })
	name := lockName(t)
	lockIt := locker(c, name)
	direct := srv.Client()
	bg := context.Background()

	// The next renewal is held on its way to Redis until the re-entry has
	// fixed the lease, and delivered then (its reply is lost).
	arrived, deliver := make(chan struct{}), make(chan struct{})
	lost := p.LoseReplyTo(faults.Containing([]byte(lock.RenewScriptSHA())), func() {
		close(arrived)
		<-deliver
	})
	ctx, err := lockIt(bg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(3 * time.Second):
		t.Fatal("no renewal within 3s")
	}
	const lease = 300 * time.Millisecond
	rctx, err := lockIt(ctx, lock.WithLease(lease))
	if err != nil {
		close(deliver)
		t.Fatal(err)
	}
	fixed := time.Now()
	close(deliver)
	select {
	case <-lost:
	case <-time.After(3 * time.Second):
		t.Fatal("the held renewal was not delivered")
	}
	if d, err := direct.PTTL(bg, name).Result(); err != nil || d > lease {
		t.Fatalf("after the stale renewal the lock's PTTL is %v (%v); want at most the fixed lease %v", d, err, lease)
	}
	time.Sleep(time.Until(fixed.Add(lease + 200*time.Millisecond)))
	if rctx.Err() == nil {
		t.Fatal("the hold's context outlived its fixed lease")
	}
	if n, err := direct.Exists(bg, name).Result(); err != nil || n != 0 {
		d, _ := direct.PTTL(bg, name).Result()
		t.Fatalf("the lock is still in Redis %v after its fixed lease of %v ran out (PTTL %v)", time.Since(fixed).Round(time.Millisecond), lease, d)
	}
}

package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/lock"
)

// TestEmbeddedRedis_RunsTheLockScripts checks that the lock's Lua scripts
// work on miniredis (TIME, hashes, PEXPIRE, PUBLISH to wake waiters) and
// that leases run out with the clock. The idempotency script of guard runs
// in TestService_IdempotentRetryGetsTheFirstOrder.
func TestEmbeddedRedis_RunsTheLockScripts(t *testing.T) {
	t.Parallel()
	b := embedded(t)
	r1, r2 := b.NewRedis(), b.NewRedis()
	defer r1.Close()
	defer r2.Close()
	c1 := lock.New(r1, lock.WithWatchdogTimeout(300*time.Millisecond))
	defer c1.Close()
	c2 := lock.New(r2)
	defer c2.Close()
	ctx := context.Background()

	m1 := c1.Mutex("sku:mini")
	held, err := m1.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t1, ok := fencing.FromContext(held)
	if !ok || t1 < fencing.Token(time.Now().Add(-time.Hour).UnixMicro()) {
		t.Fatalf("token %v (%v): want one from the server's clock in microseconds", t1, ok)
	}
	again, err := m1.Lock(held)
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if n, err := m1.HoldCount(again); err != nil || n != 2 {
		t.Fatalf("hold count %d (%v), want 2", n, err)
	}
	if err := m1.Unlock(again); err != nil {
		t.Fatal(err)
	}

	// A waiter on another client gets the lock when it is released, not
	// before: the watchdog renews it past its 300ms timeout meanwhile (the
	// first renewal finds the script missing and loads it).
	got := make(chan time.Time, 1)
	var t2 fencing.Token
	go func() {
		ctx2, err := c2.Mutex("sku:mini").TryLock(ctx, 5*time.Second)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		t2, _ = fencing.FromContext(ctx2)
		got <- time.Now()
		_ = c2.Mutex("sku:mini").Unlock(ctx2)
	}()
	time.Sleep(800 * time.Millisecond)
	if err := held.Err(); err != nil {
		t.Fatalf("lost while held: %v", context.Cause(held))
	}
	released := time.Now()
	if err := m1.Unlock(held); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		return
	}
	if at.Before(released) {
		t.Error("the waiter got the lock while it was held")
	}
	if d := at.Sub(released); d > 2*time.Second {
		t.Errorf("the waiter got the lock %v after the release: the unlock message did not wake it", d)
	}
	if t2 <= t1 {
		t.Errorf("second token %d not above the first %d", t2, t1)
	}

	// A fixed lease runs out by itself, and its holder learns it.
	leased, err := m1.Lock(ctx, lock.WithLease(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx3, err := c2.Mutex("sku:mini").TryLock(ctx, 3*time.Second)
	if err != nil {
		t.Fatalf("after the lease: %v", err)
	}
	defer c2.Mutex("sku:mini").Unlock(ctx3)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the lease ran out after %v, want about 100ms", d)
	}
	// The holder's context ends at its own deadline, on a timer that a
	// busy machine may run a little late.
	select {
	case <-leased.Done():
	case <-time.After(2 * time.Second):
	}
	if !errors.Is(context.Cause(leased), lock.ErrLost) {
		t.Errorf("the leased context: %v, want it cancelled with lock.ErrLost", context.Cause(leased))
	}
}

func TestOpenBackends_NamesWhatItUses(t *testing.T) {
	t.Parallel()
	b := embedded(t)
	if r, d := b.Embedded(); !r || !d {
		t.Errorf("Embedded() = %v, %v with nothing set", r, d)
	}
	if _, err := OpenBackends(env(map[string]string{envRedisURL: "http://nope"}), ""); err == nil {
		t.Error("a REDIS_URL that is no Redis URL was accepted")
	}
	if _, err := OpenBackends(env(map[string]string{envMySQLDSN: "not a dsn"}), ""); err == nil {
		t.Error("a MYSQL_DSN that is no DSN was accepted")
	}
}

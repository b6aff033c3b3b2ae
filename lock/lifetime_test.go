package lock_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

var errRequestEnded = errors.New("request ended")

// A hold never outlives the context it was taken with: when that context
// ends the lock is released as if unlocked, at once (not when its lease
// runs out), and the Unlock that comes later returns nil.
func TestLifetime_EndedParentReleasesTheHold(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	m := cs[0].Mutex(name)
	parent, cancel := context.WithCancelCause(context.Background())
	held, err := m.Lock(parent)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, err := cs[1].Mutex(name).TryLock(context.Background(), 10*time.Second)
		if err == nil {
			err = cs[1].Mutex(name).Unlock(ctx)
		}
		got <- err
	}()
	eventually(t, 2*time.Second, "the other Client waits", func() bool {
		ch := "redisson_lock__channel:{" + name + "}"
		n, _ := srv.Client().PubSubNumSub(context.Background(), ch).Result()
		return n[ch] >= 1
	})
	start := time.Now()
	cancel(errRequestEnded)
	if !errors.Is(context.Cause(held), errRequestEnded) {
		t.Fatalf("lock context's cause = %v, want the parent's", context.Cause(held))
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock of an ended context (its lease is 30s)")
	}
	t.Logf("waiter got the lock %v after the parent ended", time.Since(start))
	if n := srv.Do("EXISTS", name); n != int64(0) {
		t.Fatal("the lock key is still there")
	}
	if err := m.Unlock(held); err != nil {
		t.Fatalf("Unlock after the parent ended = %v, want nil", err)
	}
}

// A re-entered hold ends with the context of its first acquisition too,
// every level of it, and its key is gone from Redis.
func TestLifetime_EndedParentReleasesEveryLevel(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	parent, cancel := context.WithCancel(context.Background())
	outer, err := m.Lock(parent)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.Lock(outer)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	eventually(t, 2*time.Second, "the key is gone", func() bool { return srv.Do("EXISTS", name) == int64(0) })
	for _, ctx := range []context.Context{inner, outer} {
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock after the parent ended = %v, want nil", err)
		}
	}
	if n, err := m.HoldCount(outer); n != 0 || err != nil {
		t.Fatalf("HoldCount = %d, %v; want 0, nil", n, err)
	}
}

// Every kind ends with its context: the permits, read and write holds,
// fair locks, MultiLocks and RedLocks taken with a context that ends are
// released without an Unlock.
func TestLifetime_EveryKindEndsWithItsContext(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	type kind struct {
		lock   func(context.Context) (context.Context, error)
		unlock func(context.Context) error
		keys   []string
	}
	rw := c.RWMutex(name + ":rw")
	kinds := map[string]kind{
		"Semaphore": {func(ctx context.Context) (context.Context, error) { return c.Semaphore(name+":s", 1).Acquire(ctx) },
			c.Semaphore(name+":s", 1).Release, []string{permitsKey(name + ":s")}}, // its count of free permits stays, with an idle expiry
		"RWMutex.RLock": {func(ctx context.Context) (context.Context, error) { return rw.RLock(ctx) }, rw.RUnlock, []string{name + ":rw"}},
		"RWMutex.Lock":  {func(ctx context.Context) (context.Context, error) { return rw.Lock(ctx) }, rw.Unlock, []string{name + ":rw"}},
		"FairMutex": {func(ctx context.Context) (context.Context, error) { return c.FairMutex(name + ":f").Lock(ctx) },
			c.FairMutex(name + ":f").Unlock, []string{name + ":f"}},
		"MultiLock": {func(ctx context.Context) (context.Context, error) {
			return c.MultiLock(name+":m1", name+":m2").Lock(ctx)
		},
			c.MultiLock(name+":m1", name+":m2").Unlock, []string{name + ":m1", name + ":m2"}},
		"RedLock": {func(ctx context.Context) (context.Context, error) { return lock.NewRedLock(name+":red", c).Lock(ctx) },
			lock.NewRedLock(name+":red", c).Unlock, []string{name + ":red"}},
	}
	for kn, k := range kinds {
		parent, cancel := context.WithCancel(context.Background())
		held, err := k.lock(parent)
		if err != nil {
			t.Fatalf("%s: %v", kn, err)
		}
		cancel()
		eventually(t, 2*time.Second, kn+" released when its context ended", func() bool {
			for _, key := range k.keys {
				if srv.Do("EXISTS", key) != int64(0) {
					return false
				}
			}
			return true
		})
		if err := k.unlock(held); err != nil {
			t.Fatalf("%s: release after its context ended = %v, want nil", kn, err)
		}
	}
}

// A MultiLock taken with a context that holds one of its locks already
// re-enters it; when the MultiLock's context ends, its level of that lock
// goes, and the outer hold stays.
func TestLifetime_CompoundLockReleasesItsLevelOfAnOuterHold(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	a := c.Mutex(name + ":a")
	outer, err := a.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	parent, cancel := context.WithCancel(outer)
	if _, err := c.MultiLock(name+":a", name+":b").Lock(parent); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.HoldCount(outer); n != 2 {
		t.Fatalf("hold count under the MultiLock = %d, want 2", n)
	}
	cancel()
	eventually(t, 2*time.Second, "the MultiLock's levels go with its context", func() bool {
		n, _ := a.HoldCount(outer)
		return n == 1 && srv.Do("EXISTS", name+":b") == int64(0)
	})
	if outer.Err() != nil {
		t.Fatalf("the outer hold ended: %v", context.Cause(outer))
	}
	if err := a.Unlock(outer); err != nil {
		t.Fatal(err)
	}
}

// context.Background() holds until Unlock: nothing ends it, the watchdog
// renews it.
func TestLifetime_BackgroundHoldsUntilUnlock(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(300*time.Millisecond))[0]
	name := lockName(t)
	m := c.Mutex(name)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // three leases: only the watchdog keeps it
	if held.Err() != nil {
		t.Fatalf("a hold of context.Background() ended: %v", context.Cause(held))
	}
	if n := srv.Do("EXISTS", name); n != int64(1) {
		t.Fatal("the lock key is gone")
	}
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
}

// Re-entering a lock through a compound lock's context, again and again,
// leaves nothing behind: no child context, no AfterFunc per re-entry.
func TestLifetime_ReentriesThroughACompoundContextRetainNothing(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	a := c.Mutex(name + ":a")
	ml := c.MultiLock(name+":a", name+":b")
	mctx, err := ml.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cycle := func() {
		ctx, err := a.Lock(mctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 200; i++ {
		cycle()
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 5000
	for i := 0; i < n; i++ {
		cycle()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d bytes over %d re-entries", grown, n)
	if grown > 100*n/2 { // a child context and its AfterFunc are about 300 bytes
		t.Fatalf("heap grew %d bytes over %d re-entries: each re-entry retains memory", grown, n)
	}
	if err := ml.Unlock(mctx); err != nil {
		t.Fatal(err)
	}
}

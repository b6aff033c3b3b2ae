package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A reentryKind is one kind of hold, as the re-entry tests use it: take or
// re-enter it, release one level of it, and try, from another Client, what
// the hold keeps out.
type reentryKind struct {
	name string
	// lock returns c's lock of the kind called name.
	lock func(c *lock.Client, name string) (take func(context.Context, ...lock.LockOption) (context.Context, error), release func(context.Context) error)
	// intrude makes one attempt, through c, at what a hold of the kind keeps
	// out; it reports nil when it got in (and lets go again).
	intrude func(c *lock.Client, name string) error
}

func reentryKinds() []reentryKind {
	bg := context.Background()
	exclusive := func(try func(context.Context, time.Duration, ...lock.LockOption) (context.Context, error), undo func(context.Context) error) error {
		ctx, err := try(bg, 0)
		if err == nil {
			_ = undo(ctx)
		}
		return err
	}
	return []reentryKind{
		{"Mutex",
			func(c *lock.Client, name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				m := c.Mutex(name)
				return m.Lock, m.Unlock
			},
			func(c *lock.Client, name string) error { m := c.Mutex(name); return exclusive(m.TryLock, m.Unlock) }},
		{"FairMutex",
			func(c *lock.Client, name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				f := c.FairMutex(name)
				return f.Lock, f.Unlock
			},
			func(c *lock.Client, name string) error { f := c.FairMutex(name); return exclusive(f.TryLock, f.Unlock) }},
		{"RWMutexWrite",
			func(c *lock.Client, name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				rw := c.RWMutex(name)
				return rw.Lock, rw.Unlock
			},
			func(c *lock.Client, name string) error {
				rw := c.RWMutex(name)
				return exclusive(rw.TryRLock, rw.RUnlock)
			}},
		{"RWMutexRead",
			func(c *lock.Client, name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				rw := c.RWMutex(name)
				return rw.RLock, rw.RUnlock
			},
			func(c *lock.Client, name string) error {
				rw := c.RWMutex(name)
				return exclusive(rw.TryLock, rw.Unlock)
			}},
		{"Semaphore",
			func(c *lock.Client, name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				s := c.Semaphore(name, 1)
				return s.Acquire, s.Release
			},
			func(c *lock.Client, name string) error {
				s := c.Semaphore(name, 1)
				return exclusive(s.TryAcquire, s.Release)
			}},
	}
}

// keepsOut checks that ctx's hold has not ended and that another Client,
// other, cannot get in.
func keepsOut(t *testing.T, k reentryKind, other *lock.Client, name string, ctx context.Context, what string) {
	t.Helper()
	if ctx.Err() != nil {
		t.Fatalf("%s: the hold's context ended: %v", what, context.Cause(ctx))
	}
	if err := k.intrude(other, name); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("%s: another Client's attempt = %v; want ErrNotAcquired", what, err)
	}
}

// forEachKind runs f for every kind of hold, in parallel.
func forEachKind(t *testing.T, f func(t *testing.T, k reentryKind)) {
	for _, k := range reentryKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			f(t, k)
		})
	}
}

// A re-entry never weakens the hold it enters. One with a lease shorter than
// what is left of a fixed hold's lease does not shorten it: another Client
// stays out until the original lease ends.
func TestReentry_ShorterLeaseKeepsTheFixedDeadline(t *testing.T) {
	forEachKind(t, reentryShorterLeaseKeepsTheDeadline)
}

// A re-entry WithLease of a hold the watchdog renews leaves it renewed past
// the lease it gave: the watchdog is never turned off by a re-entry.
func TestReentry_WithLeaseLeavesTheWatchdogOn(t *testing.T) {
	forEachKind(t, reentryLeaseLeavesTheWatchdogOn)
}

// A re-entry WithLease of a fixed hold extends it to at least the new lease
// from then on; the hold then ends with ErrLost when that runs out.
func TestReentry_WithALongerLeaseExtendsAFixedHold(t *testing.T) {
	forEachKind(t, reentryLongerLeaseExtends)
}

func reentryShorterLeaseKeepsTheDeadline(t *testing.T, k reentryKind) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	take, release := k.lock(cs[0], name)
	const lease = 1500 * time.Millisecond
	start := time.Now()
	outer, err := take(context.Background(), lock.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := take(outer, lock.WithLease(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // well past the re-entry's lease
	keepsOut(t, k, cs[1], name, inner, "after a re-entry's shorter lease ran out")
	if d, _ := srv.Client().PTTL(context.Background(), name).Result(); d < lease-time.Since(start)-200*time.Millisecond {
		t.Fatalf("the lock's PTTL is %v %v after a %v lease was taken: the re-entry shortened it", d, time.Since(start).Round(time.Millisecond), lease)
	}
	if err := release(inner); err != nil {
		t.Fatal(err)
	}
	if err := release(outer); err != nil {
		t.Fatal(err)
	}
}

func reentryLeaseLeavesTheWatchdogOn(t *testing.T, k reentryKind) {
	srv := testenv.Redis(t)
	const timeout = 600 * time.Millisecond // renewals every 200ms
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(timeout))
	name := lockName(t)
	take, release := k.lock(cs[0], name)
	outer, err := take(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	inner, err := take(outer, lock.WithLease(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout) // past the re-entry's lease and past a watchdog timeout
	keepsOut(t, k, cs[1], name, inner, "a watchdog hold re-entered WithLease, two watchdog timeouts later")
	if err := release(inner); err != nil {
		t.Fatal(err)
	}
	time.Sleep(timeout)
	keepsOut(t, k, cs[1], name, outer, "the outer level, after the re-entry's Unlock")
	if err := release(outer); err != nil {
		t.Fatal(err)
	}
}

func reentryLongerLeaseExtends(t *testing.T, k reentryKind) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	take, release := k.lock(cs[0], name)
	outer, err := take(context.Background(), lock.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	const lease = 1500 * time.Millisecond
	start := time.Now()
	inner, err := take(outer, lock.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond) // past the first lease
	keepsOut(t, k, cs[1], name, inner, "past the first lease, within the re-entry's")
	select {
	case <-inner.Done():
	case <-time.After(3 * time.Second):
		t.Fatalf("the hold outlived the re-entry's lease of %v", lease)
	}
	if d := time.Since(start); d < lease-50*time.Millisecond {
		t.Fatalf("the hold ended %v after a re-entry extended it to %v", d, lease)
	}
	if !errors.Is(context.Cause(outer), lock.ErrLost) {
		t.Fatalf("cause %v; want ErrLost, the lease ran out", context.Cause(outer))
	}
	eventually(t, time.Second, "another Client gets in once the extended lease ran out", func() bool { return k.intrude(cs[1], name) == nil })
	if err := release(inner); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock after the lease ran out = %v; want ErrLost", err)
	}
}

// A re-entry WithLease whose reply arrives just after the hold's fixed lease
// ran out (its context ended with ErrLost) is no success: it answers ErrLost
// and leaves nothing behind in Redis, where the lease it asked for would
// otherwise keep the lock held by nobody. The scenario needs the reply to
// come back after the lease ran out; when the machine's timing misses that
// window, it is run again on a fresh name, up to five times.
func TestReentry_WithLeaseAnsweredAfterTheLeaseRanOutIsLost(t *testing.T) {
	forEachKind(t, func(t *testing.T, k reentryKind) {
		srv := testenv.Redis(t)
		p, rdb := proxied(t, srv)
		c := lock.New(rdb)
		t.Cleanup(func() { c.Close() })
		other := instances(t, srv, 1)[0]
		var missed []time.Duration
		for try := range 5 {
			name := fmt.Sprintf("%s:%d", lockName(t), try)
			take, release := k.lock(c, name)
			const lease, latency = time.Second, 200 * time.Millisecond
			start := time.Now()
			outer, err := take(context.Background(), lock.WithLease(lease))
			if err != nil {
				t.Fatal(err)
			}
			// The re-entry reaches Redis about 100ms before the lease ends
			// there and its reply comes back about 100ms after the hold's
			// context ended.
			time.Sleep(time.Until(start.Add(lease - latency - 100*time.Millisecond)))
			p.SetLatency(latency)
			inner, err := take(outer, lock.WithLease(5*time.Second))
			p.SetLatency(0)
			if outer.Err() == nil {
				missed = append(missed, time.Since(start))
				if err == nil {
					release(inner)
				}
				release(outer)
				continue
			}
			if !errors.Is(err, lock.ErrLost) {
				t.Fatalf("a re-entry answered after the hold's lease ran out = %v (context ended: %v); want ErrLost", err, inner.Err())
			}
			if err := k.intrude(other, name); err != nil {
				d, _ := srv.Client().PTTL(context.Background(), name).Result()
				t.Fatalf("another Client, once the re-entry returned: %v (the lock's PTTL %v); want it free", err, d)
			}
			return
		}
		t.Fatalf("in five tries the hold's lease had not run out when the re-entry returned (%v after it was taken): the machine's timing never reached the scenario", missed)
	})
}

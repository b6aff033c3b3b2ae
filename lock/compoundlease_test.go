package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A compoundReentry is a compound lock that re-enters a Mutex hold: own is
// the Client whose Mutex called name the compound lock covers, other a
// Client of the same Redis, and mk the compound lock over name.
type compoundReentry struct {
	own, other *lock.Client
	mk         func(name string) (take func(context.Context, ...lock.LockOption) (context.Context, error), release func(context.Context) error)
}

// compoundReentries returns, for each compound kind, a setup over fresh
// servers whose Clients use opts.
func compoundReentries(t *testing.T, opts ...lock.Option) map[string]func(t *testing.T) compoundReentry {
	return map[string]func(t *testing.T) compoundReentry{
		"MultiLock": func(t *testing.T) compoundReentry {
			cs := instances(t, testenv.Redis(t), 2, opts...)
			return compoundReentry{cs[0], cs[1], func(name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				ml := cs[0].MultiLock(name, name+":b")
				return ml.Lock, ml.Unlock
			}}
		},
		"RedLock": func(t *testing.T) compoundReentry {
			var own []*lock.Client
			var other *lock.Client
			for i := range 3 {
				cs := instances(t, testenv.Redis(t), 2, opts...)
				own = append(own, cs[0])
				if i == 0 {
					other = cs[1]
				}
			}
			return compoundReentry{own[0], other, func(name string) (func(context.Context, ...lock.LockOption) (context.Context, error), func(context.Context) error) {
				r := lock.NewRedLock(name, own...)
				return r.Lock, r.Unlock
			}}
		},
	}
}

// forEachCompound runs f for MultiLock and RedLock, in parallel.
func forEachCompound(t *testing.T, f func(t *testing.T, e compoundReentry), opts ...lock.Option) {
	for kind, setup := range compoundReentries(t, opts...) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f(t, setup(t))
		})
	}
}

// keptOut checks that the contexts of held are live and that other cannot
// take the Mutex called name.
func keptOut(t *testing.T, other *lock.Client, name, what string, held ...context.Context) {
	t.Helper()
	for i, ctx := range held {
		if ctx.Err() != nil {
			t.Fatalf("%s: the owner's context %d ended: %v", what, i, context.Cause(ctx))
		}
	}
	m := other.Mutex(name)
	got, err := m.TryLock(context.Background(), 0)
	if err == nil {
		_ = m.Unlock(got)
		t.Fatalf("%s: another Client took %s", what, name)
	}
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("%s: another Client's TryLock = %v, want ErrNotAcquired", what, err)
	}
}

// A compound lock that re-enters a fixed Mutex hold WithLease longer than
// what is left of it extends the Mutex hold to that lease: it stays held,
// and another Client stays out, until the re-entry's lease ends.
func TestCompound_ReentryWithALongerLeaseExtendsAFixedHold(t *testing.T) {
	forEachCompound(t, func(t *testing.T, e compoundReentry) {
		name := lockName(t)
		m := e.own.Mutex(name)
		held, err := m.Lock(context.Background(), lock.WithLease(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		take, release := e.mk(name)
		const lease = 1500 * time.Millisecond
		start := time.Now()
		inner, err := take(held, lock.WithLease(lease))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(800 * time.Millisecond) // past the Mutex's own lease
		keptOut(t, e.other, name, "past the Mutex's lease, within the re-entry's", held, inner)
		select {
		case <-held.Done():
		case <-time.After(3 * time.Second):
			t.Fatalf("the Mutex hold outlived the re-entry's lease of %v", lease)
		}
		if d := time.Since(start); d < lease-50*time.Millisecond {
			t.Fatalf("the Mutex hold ended %v after a re-entry extended it to %v", d, lease)
		}
		_ = release(inner)
	})
}

// A compound lock that re-enters a fixed Mutex hold WithLease shorter than
// what is left of it does not shorten it: another Client stays out until
// the Mutex's own lease ends.
func TestCompound_ReentryWithAShorterLeaseKeepsTheFixedDeadline(t *testing.T) {
	forEachCompound(t, func(t *testing.T, e compoundReentry) {
		name := lockName(t)
		m := e.own.Mutex(name)
		held, err := m.Lock(context.Background(), lock.WithLease(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		take, release := e.mk(name)
		inner, err := take(held, lock.WithLease(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // well past the re-entry's lease
		keptOut(t, e.other, name, "after a re-entry's shorter lease ran out", held)
		_ = release(inner)
		keptOut(t, e.other, name, "after the re-entry's Unlock", held)
		if err := m.Unlock(held); err != nil {
			t.Fatal(err)
		}
	})
}

// A compound lock that re-enters a Mutex hold the watchdog renews WithLease
// leaves it renewed past that lease: a re-entry never turns the watchdog
// off.
func TestCompound_ReentryWithLeaseLeavesTheWatchdogOn(t *testing.T) {
	const timeout = 600 * time.Millisecond // renewals every 200ms
	forEachCompound(t, func(t *testing.T, e compoundReentry) {
		name := lockName(t)
		m := e.own.Mutex(name)
		held, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		take, release := e.mk(name)
		inner, err := take(held, lock.WithLease(150*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * timeout) // past the re-entry's lease and a watchdog timeout
		keptOut(t, e.other, name, "a watchdog hold re-entered WithLease, two watchdog timeouts later", held)
		_ = release(inner) // a RedLock taken WithLease may have ended with its own validity
		if err := m.Unlock(held); err != nil {
			t.Fatal(err)
		}
	}, lock.WithWatchdogTimeout(timeout))
}

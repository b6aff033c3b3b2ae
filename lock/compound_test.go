package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// stillOneHolder checks, for five leases of lease, that the contexts of
// held stay live and that other cannot take the lock called name
// meanwhile: the owner's hold is renewed, not left to expire.
func stillOneHolder(t *testing.T, other *lock.Client, name string, lease time.Duration, held ...context.Context) {
	t.Helper()
	for deadline := time.Now().Add(5 * lease); time.Now().Before(deadline); time.Sleep(lease / 10) {
		for i, ctx := range held {
			if ctx.Err() != nil {
				t.Fatalf("the owner's context %d ended: %v", i, context.Cause(ctx))
			}
		}
		got, err := other.Mutex(name).TryLock(context.Background(), 0)
		if err == nil {
			other.Mutex(name).Unlock(got)
			t.Fatalf("two holders: another Client took %s while the owner's contexts are live (the re-entered hold was left unrenewed)", name)
		}
		if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("another Client's TryLock = %v, want ErrNotAcquired", err)
		}
	}
}

// A compound is how a test locks and unlocks a compound lock.
type compound struct {
	lock   func(ctx context.Context) (context.Context, error)
	unlock func(ctx context.Context) error
}

// reenterAfterAFailedUnlock takes the Mutex of c called name+":"+subtest
// (c's final releases refuse while refuse is told to, not sent: a failure
// known not applied), fails its final Unlock, and re-enters it with the
// lock mk makes for that name. Then, in
// "Held", it checks for five leases that both contexts stay live and that
// other cannot take the Mutex's lock; in "UnlockedAtOnce" the re-entry is
// unlocked at once and the Mutex's hold, left at one level, must stay held
// and renewed: the background retry of its failed Unlock stopped with the
// re-entry. It returns the names it locked.
func reenterAfterAFailedUnlock(t *testing.T, c, other *lock.Client, refuse *refusedCalls, lease time.Duration, name string, mk func(name string) compound) []string {
	var names []string
	for _, atOnce := range []bool{false, true} {
		sub := map[bool]string{false: "Held", true: "UnlockedAtOnce"}[atOnce]
		name := name + ":" + sub
		names = append(names, name)
		t.Run(sub, func(t *testing.T) {
			m, cl := c.Mutex(name), mk(name)
			held, err := m.Lock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			refuse.left.Store(1 << 20) // the release and its retries in the background fail until the re-entry is made
			if err := m.Unlock(held); err == nil {
				t.Fatal("an unlock that never left reported success")
			}
			cctx, err := cl.lock(held) // the owner keeps the lock after all
			refuse.left.Store(0)
			if err != nil {
				t.Fatal(err)
			}
			if atOnce {
				if err := cl.unlock(cctx); err != nil {
					t.Fatal(err)
				}
				stillOneHolder(t, other, name, lease, held)
			} else {
				stillOneHolder(t, other, name, lease, held, cctx)
				if n, _ := m.HoldCount(held); n != 2 {
					t.Fatalf("hold count = %d, want 2", n)
				}
				if err := cl.unlock(cctx); err != nil {
					t.Fatal(err)
				}
			}
			if n, _ := m.HoldCount(held); n != 1 {
				t.Fatalf("hold count after the re-entry's Unlock = %d, want the first Lock's 1", n)
			}
			if err := m.Unlock(held); err != nil {
				t.Fatal(err)
			}
			if locked, _ := m.IsLocked(context.Background()); locked {
				t.Fatal("still held after the last Unlock")
			}
		})
	}
	return names
}

// The Mutex's own re-entry of a hold whose final Unlock failed, not
// applied, goes through the same transition as a compound lock's: it keeps
// the hold, and the background retry of the failed Unlock stops.
func TestMutex_ReentryOfAHoldWhoseUnlockFailedKeepsItRenewed(t *testing.T) {
	const lease = 300 * time.Millisecond
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	refuse := &refusedCalls{match: isRelease, dial: true}
	rdb.AddHook(refuse)
	c := lock.New(rdb, lock.WithWatchdogTimeout(lease))
	defer c.Close()
	reenterAfterAFailedUnlock(t, c, instances(t, srv, 1)[0], refuse, lease, lockName(t), func(name string) compound {
		m := c.Mutex(name)
		return compound{
			lock:   func(ctx context.Context) (context.Context, error) { return m.TryLock(ctx, 5*time.Second) },
			unlock: m.Unlock,
		}
	})
}

// A MultiLock that re-enters a Mutex hold whose final Unlock failed (and is
// retried in the background) keeps it: the hold is held and renewed again,
// as the Mutex's own re-entry makes it.
func TestMultiLock_ReentryOfAHoldWhoseUnlockFailedKeepsItRenewed(t *testing.T) {
	const lease = 300 * time.Millisecond
	srv := testenv.Redis(t)
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	refuse := &refusedCalls{match: isRelease, dial: true}
	rdb.AddHook(refuse)
	c := lock.New(rdb, lock.WithWatchdogTimeout(lease))
	defer c.Close()
	names := reenterAfterAFailedUnlock(t, c, instances(t, srv, 1)[0], refuse, lease, lockName(t), func(name string) compound {
		ml := c.MultiLock(name, name+":b") // re-enters name, takes name:b
		return compound{
			lock:   func(ctx context.Context) (context.Context, error) { return ml.TryLock(ctx, 5*time.Second) },
			unlock: ml.Unlock,
		}
	})
	for _, n := range names {
		if got := srv.Do("EXISTS", n, n+":b"); got != int64(0) {
			t.Fatalf("%d locks of %s left held after the last Unlock", got, n)
		}
	}
}

// A RedLock that re-enters a node's Mutex hold whose final Unlock failed
// (and is retried in the background) keeps it, as a MultiLock does.
func TestRedLock_ReentryOfAHoldWhoseUnlockFailedKeepsItRenewed(t *testing.T) {
	const lease = 300 * time.Millisecond
	nodes := redisNodes(t, 3)
	refuse := &refusedCalls{match: isRelease, dial: true}
	cs := make([]*lock.Client, len(nodes))
	for i, n := range nodes {
		rdb := n.Client(func(o *redis.Options) { o.MaxRetries = -1 })
		if i == 0 {
			rdb.AddHook(refuse)
		}
		cs[i] = lock.New(rdb, lock.WithWatchdogTimeout(lease))
		t.Cleanup(func() { cs[i].Close() })
	}
	names := reenterAfterAFailedUnlock(t, cs[0], instances(t, nodes[0], 1)[0], refuse, lease, lockName(t), func(name string) compound {
		rl := lock.NewRedLock(name, cs...) // re-enters node 0, takes the others
		return compound{
			lock:   func(ctx context.Context) (context.Context, error) { return rl.TryLock(ctx, 5*time.Second) },
			unlock: rl.Unlock,
		}
	})
	for _, name := range names {
		for i, n := range nodes {
			if got := n.Do("EXISTS", name); got != int64(0) {
				t.Fatalf("%s still held on node %d after the last Unlock", name, i)
			}
		}
	}
}

// A MultiLock's token is above the counter of every lock of its set,
// whichever place it has in the order the set is taken in: the first, one in
// the middle, the last. Every later token of any of them is above it.
func TestMultiLock_TokenIsAboveTheCounterOfEveryLockWhateverItsPlace(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	base := lockName(t)
	ml := cs[0].MultiLock(base+":a", base+":b", base+":c")
	names := ml.Names() // in the order they are taken
	for place, ahead := range names {
		t.Run(fmt.Sprintf("place%d", place), func(t *testing.T) {
			// ahead's counter is far ahead of the others' (and of the clock),
			// further at each place so that it is ahead of the tokens before.
			high := int64(8_000_000_000_000_000) + int64(place)*1_000_000_000_000
			srv.Do("SET", "redisson_lock_token:{"+ahead+"}", fmt.Sprint(high))
			// Each lock is released before its token is judged, so that a
			// failure leaves nothing held for the places after it.
			ctx, err := ml.TryLock(context.Background(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tok, ok := fencing.FromContext(ctx)
			if err := ml.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if !ok || int64(tok) <= high {
				t.Fatalf("MultiLock token %d, want above the counter %d of %s (taken %d of %d)", tok, high, ahead, place+1, len(names))
			}
			for _, n := range names {
				later, err := cs[1].Mutex(n).TryLock(context.Background(), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				lt, _ := fencing.FromContext(later)
				if err := cs[1].Mutex(n).Unlock(later); err != nil {
					t.Fatal(err)
				}
				if lt <= tok {
					t.Fatalf("later token of %s = %d, not above the MultiLock's %d", n, lt, tok)
				}
			}
		})
	}
}

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// namesOnEveryMaster returns one lock name per master of the cluster, each
// in another slot.
func namesOnEveryMaster(t *testing.T, rdb *redis.ClusterClient, prefix string, masters int) []string {
	t.Helper()
	seen := make(map[string]bool)
	var out []string
	for i := 0; len(out) < masters; i++ {
		if i > 10000 {
			t.Fatal("no names found on every master")
		}
		name := fmt.Sprintf("%s:%d", prefix, i)
		node, err := rdb.MasterForKey(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			out = append(out, name)
		}
	}
	return out
}

// TestCluster runs every lock kind on a 3-master Redis Cluster, with locks
// in slots of every master; one cluster serves all subtests.
func TestCluster(t *testing.T) {
	env := testenv.Cluster(t, 3)
	rdb := env.Client()
	newClients := func(t *testing.T, n int, opts ...lock.Option) []*lock.Client {
		out := make([]*lock.Client, n)
		for i := range out {
			c := lock.New(env.Client(), opts...)
			t.Cleanup(func() { c.Close() })
			out[i] = c
		}
		return out
	}
	bg := context.Background()

	t.Run("MutexesInEverySlotAreWokenByShardedPubSub", func(t *testing.T) {
		cs := newClients(t, 4) // 30s leases: only an unlock message explains a quick wake-up
		for _, name := range namesOnEveryMaster(t, rdb, lockName(t), 3) {
			var inside, overlaps atomic.Int32
			var wg sync.WaitGroup
			for _, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := 0; r < 5; r++ {
						ctx, err := c.Mutex(name).Lock(bg)
						if err != nil {
							t.Error(err)
							return
						}
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						time.Sleep(200 * time.Microsecond)
						inside.Add(-1)
						c.Mutex(name).Unlock(ctx)
					}
				}()
			}
			wg.Wait()
			if overlaps.Load() != 0 {
				t.Fatalf("%s: holds overlapped", name)
			}
			wakeUp(t, name, func() (func(), error) {
				ctx, err := cs[0].Mutex(name).Lock(bg)
				return func() { cs[0].Mutex(name).Unlock(ctx) }, err
			}, func() error {
				ctx, err := cs[1].Mutex(name).Lock(bg)
				if err == nil {
					cs[1].Mutex(name).Unlock(ctx)
				}
				return err
			})
		}
	})

	t.Run("FairRWAndSemaphoreWakeUps", func(t *testing.T) {
		cs := newClients(t, 2)
		names := namesOnEveryMaster(t, rdb, lockName(t), 3)
		wakeUp(t, "fair "+names[0], func() (func(), error) {
			ctx, err := cs[0].FairMutex(names[0]).Lock(bg)
			return func() { cs[0].FairMutex(names[0]).Unlock(ctx) }, err
		}, func() error {
			ctx, err := cs[1].FairMutex(names[0]).Lock(bg)
			if err == nil {
				cs[1].FairMutex(names[0]).Unlock(ctx)
			}
			return err
		})
		wakeUp(t, "rw "+names[1], func() (func(), error) {
			ctx, err := cs[0].RWMutex(names[1]).RLock(bg)
			return func() { cs[0].RWMutex(names[1]).RUnlock(ctx) }, err
		}, func() error {
			ctx, err := cs[1].RWMutex(names[1]).Lock(bg)
			if err == nil {
				cs[1].RWMutex(names[1]).Unlock(ctx)
			}
			return err
		})
		wakeUp(t, "semaphore "+names[2], func() (func(), error) {
			ctx, err := cs[0].Semaphore(names[2], 1).Acquire(bg)
			return func() { cs[0].Semaphore(names[2], 1).Release(ctx) }, err
		}, func() error {
			ctx, err := cs[1].Semaphore(names[2], 1).Acquire(bg)
			if err == nil {
				cs[1].Semaphore(names[2], 1).Release(ctx)
			}
			return err
		})
	})

	t.Run("MultiLockAcrossSlotsNeverDeadlocks", func(t *testing.T) {
		cs := newClients(t, 4)
		names := namesOnEveryMaster(t, rdb, lockName(t), 3)
		reversed := []string{names[2], names[1], names[0]}
		var inside, overlaps atomic.Int32
		var wg sync.WaitGroup
		done := make(chan struct{})
		for i, c := range cs {
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ml := c.MultiLock(names...)
					if (i+g)%2 == 1 {
						ml = c.MultiLock(reversed...)
					}
					for r := 0; r < 5; r++ {
						ctx, err := ml.Lock(bg)
						if err != nil {
							t.Error(err)
							return
						}
						if inside.Add(1) != 1 {
							overlaps.Add(1)
						}
						time.Sleep(200 * time.Microsecond)
						inside.Add(-1)
						if err := ml.Unlock(ctx); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("MultiLocks over the same names in other orders deadlocked")
		}
		if overlaps.Load() != 0 {
			t.Fatal("MultiLock holds overlapped")
		}
		// All or none across slots: one name held elsewhere, the rest stay free.
		held, err := cs[0].Mutex(names[2]).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs[1].MultiLock(names...).TryLock(bg, 100*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
		}
		for _, n := range names[:2] {
			if rdb.Exists(bg, n).Val() != 0 {
				t.Fatalf("%s left held by a MultiLock that gave up", n)
			}
		}
		cs[0].Mutex(names[2]).Unlock(held)
		// A MultiLock's token is valid for each lock, on every master.
		ctx, err := cs[1].MultiLock(names...).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := fencing.FromContext(ctx)
		cs[1].MultiLock(names...).Unlock(ctx)
		for _, n := range names {
			c, err := cs[2].Mutex(n).Lock(bg)
			if err != nil {
				t.Fatal(err)
			}
			if nt, _ := fencing.FromContext(c); nt <= tok {
				t.Fatalf("later token of %s = %d, not above the MultiLock's %d", n, nt, tok)
			}
			cs[2].Mutex(n).Unlock(c)
		}
	})

	t.Run("MultiLockKeepsEarlierSlotsWhileWaitingForALaterOne", func(t *testing.T) {
		const timeout = 600 * time.Millisecond
		cs := newClients(t, 3, lock.WithWatchdogTimeout(timeout))
		names := namesOnEveryMaster(t, rdb, lockName(t), 2)
		sort.Slice(names, func(i, j int) bool {
			return rdb.ClusterKeySlot(bg, names[i]).Val() < rdb.ClusterKeySlot(bg, names[j]).Val()
		})
		first, later := names[0], names[1] // taken in this order
		held, err := cs[1].Mutex(later).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			ctx context.Context
			err error
		}
		got := make(chan result, 1)
		ml := cs[0].MultiLock(first, later)
		go func() {
			ctx, err := ml.Lock(bg)
			got <- result{ctx, err}
		}()
		eventually(t, 2*time.Second, "the MultiLock takes the first slot", func() bool {
			return rdb.Exists(bg, first).Val() == 1
		})
		// The MultiLock waits for the later slot for three leases: the
		// first lock must stay its own all along.
		if ctx, err := cs[2].Mutex(first).TryLock(bg, 3*timeout); err == nil {
			cs[2].Mutex(first).Unlock(ctx)
			t.Fatal("another Client took a lock the waiting MultiLock had taken")
		} else if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatal(err)
		}
		if err := cs[1].Mutex(later).Unlock(held); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.ctx.Err() != nil {
			t.Fatalf("the MultiLock returned a lost hold: %v", context.Cause(r.ctx))
		}
		time.Sleep(timeout) // renewed together from now on
		if r.ctx.Err() != nil {
			t.Fatalf("lost: %v", context.Cause(r.ctx))
		}
		if err := ml.Unlock(r.ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("MultiLockInOneSlotIsOneScript", func(t *testing.T) {
		sent := testenv.NewCommandCounter()
		crdb := env.Client()
		crdb.AddHook(sent)
		c := lock.New(crdb)
		defer c.Close()
		names := []string{"{order:7}:stock", "{order:7}:balance", "{order:7}:coupon"}
		ml := c.MultiLock(names...)
		warm, err := ml.Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		ml.Unlock(warm)
		before := sent.Snapshot()
		ctx, err := ml.Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		if err := ml.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		after := sent.Snapshot()
		if d := after["evalsha"] - before["evalsha"]; d != 2 {
			t.Fatalf("Lock+Unlock of 3 locks in one slot ran %d scripts, want 2 (%v)", d, sent)
		}
	})

	t.Run("WatchdogRenewsAcrossSlots", func(t *testing.T) {
		cs := newClients(t, 2, lock.WithWatchdogTimeout(time.Second))
		names := namesOnEveryMaster(t, rdb, lockName(t), 3)
		m, err := cs[0].Mutex(names[0]).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cs[0].RWMutex(names[1]).RLock(bg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := cs[0].Semaphore(names[2], 1).Acquire(bg)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2200 * time.Millisecond) // over two watchdog timeouts
		for _, ctx := range []context.Context{m, r, s} {
			if ctx.Err() != nil {
				t.Fatalf("a hold was lost: %v", context.Cause(ctx))
			}
		}
		if _, err := cs[1].Mutex(names[0]).TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("mutex taken past its renewed lease: %v", err)
		}
		if _, err := cs[1].RWMutex(names[1]).TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("write lock taken past a renewed read lease: %v", err)
		}
		if _, err := cs[1].Semaphore(names[2], 1).TryAcquire(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("permit taken past its renewed lease: %v", err)
		}
		cs[0].Mutex(names[0]).Unlock(m)
		cs[0].RWMutex(names[1]).RUnlock(r)
		cs[0].Semaphore(names[2], 1).Release(s)
	})
}

// wakeUp holds a lock with hold, starts a waiter, releases the lock and
// checks that the waiter got it within 200ms: woken by the unlock message.
func wakeUp(t *testing.T, what string, hold func() (release func(), err error), waiter func() error) {
	t.Helper()
	release, err := hold()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	got := make(chan time.Time, 1)
	go func() {
		if err := waiter(); err != nil {
			t.Errorf("%s: waiter: %v", what, err)
			close(got)
			return
		}
		got <- time.Now()
	}()
	time.Sleep(100 * time.Millisecond) // the waiter subscribed and sleeps
	released := time.Now()
	release()
	select {
	case at, ok := <-got:
		if !ok {
			t.FailNow()
		}
		if d := at.Sub(released); d > 200*time.Millisecond {
			t.Fatalf("%s: waiter got in %v after the release: not woken by it", what, d)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: waiter not woken", what)
	}
}

// TestSentinel_FailoverKeepsTokensIncreasingAndReportsVanishedLocks kills the
// master of a Sentinel deployment while locks are held. One of them never
// reached the replica (its write is removed there, as replication lag would
// have lost it), and the replica's token counter is behind.
func TestSentinel_FailoverKeepsTokensIncreasingAndReportsVanishedLocks(t *testing.T) {
	env := testenv.Sentinel(t)
	opt := lock.WithWatchdogTimeout(6 * time.Second) // longer than the failover takes
	newClient := func() *lock.Client {
		c := lock.New(env.FailoverClient(func(o *redis.FailoverOptions) {
			o.DialTimeout = 200 * time.Millisecond
		}), opt)
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := newClient(), newClient()
	bg := context.Background()
	base := lockName(t)
	kept, vanished := base+":kept", base+":vanished"

	// Tokens issued before the failover, by both Clients.
	var before fencing.Token
	for i := 0; i < 5; i++ {
		ctx, err := b.Mutex(fmt.Sprintf("%s:%d", base, i)).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := fencing.FromContext(ctx)
		before = max(before, tok)
		b.Mutex(fmt.Sprintf("%s:%d", base, i)).Unlock(ctx)
	}
	keptCtx, err := a.Mutex(kept).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	vanishedCtx, err := a.Mutex(vanished).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := fencing.FromContext(vanishedCtx)
	before = max(before, tok)
	if n := env.Master.Do("WAIT", 1, 2000); n != int64(1) {
		t.Fatalf("replica did not confirm the locks: %v", n)
	}
	// The replica misses the last writes of the vanished lock: its hash and
	// its token counter, which on the replica falls far behind.
	env.Replica.Do("CONFIG", "SET", "replica-read-only", "no")
	env.Replica.Do("DEL", vanished)
	env.Replica.Do("SET", "redisson_lock_token:{"+vanished+"}", "1")

	killed := time.Now()
	env.Master.Kill()
	env.WaitForFailover(20 * time.Second)
	t.Logf("failover took %v", time.Since(killed))

	// New acquisitions work through the failover client, and their tokens
	// exceed every token issued before the failover although the counter
	// went back: tokens follow the new master's clock.
	taken, err := b.Mutex(vanished).TryLock(bg, 10*time.Second)
	if err != nil {
		t.Fatalf("acquiring after the failover: %v", err)
	}
	if after, _ := fencing.FromContext(taken); after <= before {
		t.Fatalf("token after the failover %d is not above %d, issued before it", after, before)
	}
	for i := 0; i < 3; i++ {
		ctx, err := b.Mutex(fmt.Sprintf("%s:after:%d", base, i)).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		if tok, _ := fencing.FromContext(ctx); tok <= before {
			t.Fatalf("token after the failover %d is not above %d", tok, before)
		}
		b.Mutex(fmt.Sprintf("%s:after:%d", base, i)).Unlock(ctx)
	}

	// The holder whose lock vanished learns it; the one the replica had
	// keeps its lock.
	select {
	case <-vanishedCtx.Done():
		if !errors.Is(context.Cause(vanishedCtx), lock.ErrLost) {
			t.Fatalf("vanished lock's cause = %v, want ErrLost", context.Cause(vanishedCtx))
		}
		t.Logf("the holder learned its lock vanished %v after the master died", time.Since(killed))
	case <-time.After(10 * time.Second):
		t.Fatal("the holder of the vanished lock was never told")
	}
	if keptCtx.Err() != nil {
		t.Fatalf("the replicated lock was lost too: %v", context.Cause(keptCtx))
	}
	if _, err := b.Mutex(kept).TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the replicated lock was free after the failover: %v", err)
	}

	// Waiting is pushed again: pub/sub reconnected to the new master.
	wakeUp(t, "after failover", func() (func(), error) {
		return func() { a.Mutex(kept).Unlock(keptCtx) }, nil
	}, func() error {
		ctx, err := b.Mutex(kept).Lock(bg)
		if err == nil {
			b.Mutex(kept).Unlock(ctx)
		}
		return err
	})
	b.Mutex(vanished).Unlock(taken)
}

// TestCluster_WaiterIsWokenAfterAFailover kills the master of a waiter's
// lock while it waits: once a replica has taken over, the holder's unlock
// must still wake the waiter through sharded pub/sub, not leave it waiting
// for the lease it last saw.
func TestCluster_WaiterIsWokenAfterAFailover(t *testing.T) {
	env := testenv.Cluster(t, 3)
	replica := env.AddReplica(env.Masters[0])
	rdb := env.Client()
	bg := context.Background()
	name := ""
	for i := 0; name == ""; i++ {
		n := fmt.Sprintf("test:failover:%d", i)
		if node, err := rdb.MasterForKey(bg, n); err != nil {
			t.Fatal(err)
		} else if node.Options().Addr == env.Masters[0].Addr {
			name = n
		}
	}
	channel := "redisson_lock__channel:{" + name + "}"
	holder := lock.New(env.Client(), lock.WithWatchdogTimeout(20*time.Second))
	waiter := lock.New(env.Client())
	t.Cleanup(func() { holder.Close(); waiter.Close() })
	held, err := holder.Mutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, err := waiter.Mutex(name).TryLock(bg, 25*time.Second)
		got <- result{time.Now(), err}
		if err == nil {
			waiter.Mutex(name).Unlock(ctx)
		}
	}()
	eventually(t, 5*time.Second, "waiter subscribed on the master", func() bool {
		n, _ := env.Masters[0].Do("PUBSUB", "SHARDNUMSUB", channel).([]any)
		return len(n) == 2 && n[1] == int64(1)
	})
	if n := env.Masters[0].Do("WAIT", 1, 5000); n != int64(1) {
		t.Fatalf("the lock did not reach the replica: WAIT = %v", n)
	}
	env.Masters[0].Kill()
	killed := time.Now()
	eventually(t, 20*time.Second, "replica promoted", func() bool {
		info, _ := replica.Do("INFO", "replication").(string)
		return strings.Contains(info, "role:master")
	})
	t.Logf("failover took %v", time.Since(killed))
	// Nobody reloads a go-redis slot map here (by itself go-redis does once
	// its map is 10s old): the lock Clients have it reloaded when they
	// cannot dial the dead master.
	unlocking := time.Now()
	unlockErr := holder.Mutex(name).Unlock(held)
	if unlockErr != nil {
		t.Errorf("Unlock after the failover: %v", unlockErr)
	}
	t.Logf("the Unlock took %v", time.Since(unlocking).Round(time.Millisecond))
	t.Logf("unlock: %v; on the new master: %v %v", unlockErr, replica.Do("HGETALL", name), replica.Do("PTTL", name))
	if n := replica.Do("EXISTS", name); n != int64(0) {
		t.Fatalf("the lock is still on the new master after its Unlock (PTTL %v)", replica.Do("PTTL", name))
	}
	unlocked := time.Now()
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v (unlock: %v)", r.err, unlockErr)
	}
	if d := r.at.Sub(unlocked); d > 3*time.Second {
		t.Fatalf("waiter got the lock %v after its unlock on the new master: not woken", d)
	}
}

package lock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/redissonemu"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// These tests put this package's kinds and a Java service on Redisson (the
// redissonemu protocol emulator, checked against the real Java client) on
// one name; the fair line, the read/write lock and the semaphore have files
// of their own.

// javaService returns an emulated Redisson instance on srv.
func javaService(t testing.TB, srv *testenv.RedisServer, cfg redissonemu.Config) *redissonemu.Client {
	t.Helper()
	j := redissonemu.New(srv.Client(), cfg)
	t.Cleanup(j.Close)
	return j
}

// side acquires a hold for worker; write says whether the hold is
// exclusive, release gives it back.
type side func(ctx context.Context, worker int) (release func() error, write bool, err error)

// contend runs two goroutines of ours and two Java threads on one name for
// d, each holding 0.5–3.5 ms at a time as soon as it can, and returns what
// they did.
func contend(t *testing.T, d time.Duration, ours, java side, capacity int, shared bool) redissonemu.Report {
	t.Helper()
	return contendAs(t, d, [2]string{"go", "java"}, ours, java, capacity, shared)
}

// contendAs is contend with other names for the two sides.
func contendAs(t *testing.T, d time.Duration, names [2]string, ours, java side, capacity int, shared bool) redissonemu.Report {
	t.Helper()
	var log redissonemu.HoldLog
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(name string, s side, worker int) {
		defer wg.Done()
		for time.Now().Before(end) {
			asked := time.Now()
			release, write, err := s(ctx, worker)
			if err != nil {
				errs <- err
				return
			}
			got := time.Now()
			time.Sleep(time.Duration(500+rand.IntN(3000)) * time.Microsecond)
			freed := time.Now()
			if err := release(); err != nil {
				errs <- err
				return
			}
			log.Add(redissonemu.Hold{Worker: name, Write: write, Asked: asked, Got: got, Freed: freed})
		}
	}
	for w := range 2 {
		wg.Add(2)
		go run(names[0]+"#"+string(rune('0'+w)), ours, w)
		go run(names[1]+"#"+string(rune('0'+w)), java, w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r := log.Check(capacity, shared)
	t.Log(r)
	return r
}

// exclusive is what a Mutex and a FairMutex have in common.
type exclusive interface {
	Lock(ctx context.Context, opts ...lock.LockOption) (context.Context, error)
	TryLock(ctx context.Context, wait time.Duration, opts ...lock.LockOption) (context.Context, error)
	Unlock(ctx context.Context) error
}

func mutexSide(m exclusive) side {
	return func(ctx context.Context, _ int) (func() error, bool, error) {
		hctx, err := m.Lock(ctx)
		return func() error { return m.Unlock(hctx) }, true, err
	}
}

func javaLockSide(l *redissonemu.Lock) side {
	return func(ctx context.Context, worker int) (func() error, bool, error) {
		thread := int64(worker + 1)
		err := l.Lock(ctx, thread)
		return func() error { return l.Unlock(context.Background(), thread) }, true, err
	}
}

func TestRedissonEmu_MutexAndRLockExcludeEachOtherUnderContention(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	r := contend(t, 2*time.Second, mutexSide(c.Mutex(name)), javaLockSide(j.Lock(name)), 1, false)
	if r.Overlaps != 0 {
		t.Fatalf("%d holds began while the other side held the lock", r.Overlaps)
	}
	if r.Holds < 100 {
		t.Fatalf("only %d holds in 2 s", r.Holds)
	}
}

func TestRedissonEmu_AnRLockUnlockWakesAMutexWaiter(t *testing.T) {
	srv := testenv.Redis(t)
	// A hash tag inside the name: the channel is "redisson_lock__channel:<name>".
	name := lockName(t) + ":{42}"
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.Lock(name).Lock(ctx, 1); err != nil { // watchdog: a 30 s lease
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		hctx, err := c.Mutex(name).TryLock(ctx, 10*time.Second)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		c.Mutex(name).Unlock(hctx)
	}()
	eventually(t, 5*time.Second, "our waiter subscribed", func() bool {
		return srv.Do("PUBSUB", "NUMSUB", redissonemu.Prefixed("redisson_lock__channel", name)).([]any)[1] == int64(1)
	})
	unlocked := time.Now()
	if err := j.Lock(name).Unlock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		return
	}
	if d := at.Sub(unlocked); d > 500*time.Millisecond {
		t.Fatalf("our waiter took the lock %v after the Java unlock; the lease was 30 s: not woken by the message", d)
	}
}

func TestRedissonEmu_AMutexUnlockWakesAnRLockWaiter(t *testing.T) {
	srv := testenv.Redis(t)
	// A hash tag inside the name: the channel is "redisson_lock__channel:<name>".
	name := lockName(t) + ":{42}"
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	hctx, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		if ok, err := j.Lock(name).TryLock(ctx, 7, 10*time.Second, 0); err != nil || !ok {
			t.Errorf("Java tryLock = %v, %v", ok, err)
			close(got)
			return
		}
		got <- time.Now()
		j.Lock(name).Unlock(ctx, 7)
	}()
	eventually(t, 5*time.Second, "the Java waiter subscribed", func() bool {
		return srv.Do("PUBSUB", "NUMSUB", redissonemu.Prefixed("redisson_lock__channel", name)).([]any)[1] == int64(1)
	})
	unlocked := time.Now()
	if err := c.Mutex(name).Unlock(hctx); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		return
	}
	if d := at.Sub(unlocked); d > 500*time.Millisecond {
		t.Fatalf("the Java waiter took the lock %v after our unlock; the lease was 30 s: not woken by the message", d)
	}
}

func TestRedissonEmu_ADeadJavaHolderExpiresForAMutex(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{LockWatchdogTimeout: 600 * time.Millisecond})
	ctx := context.Background()
	if err := j.Lock(name).Lock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // renewed meanwhile
	j.Lock(name).Abandon(1)            // the JVM dies
	died := time.Now()
	hctx, err := c.Mutex(name).TryLock(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Mutex(name).Unlock(hctx)
	if d := time.Since(died); d > 1500*time.Millisecond {
		t.Fatalf("took %v after the Java holder died, with a 600 ms lease", d)
	}
}

func TestRedissonEmu_ADeadHolderOfOursExpiresForAnRLock(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if _, err := c.Mutex(name).Lock(ctx, lock.WithLease(400*time.Millisecond)); err != nil { // never unlocked
		t.Fatal(err)
	}
	start := time.Now()
	if ok, _ := j.Lock(name).TryLock(ctx, 1, 0, 0); ok {
		t.Fatal("the Java thread got a lock we hold")
	}
	if ok, err := j.Lock(name).TryLock(ctx, 1, 5*time.Second, 0); err != nil || !ok {
		t.Fatalf("Java tryLock after our lease = %v, %v", ok, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("the Java thread got the lock after %v, want when our 400 ms lease ended", d)
	}
	j.Lock(name).Unlock(ctx, 1)
}

func TestRedissonEmu_ANamespaceMatchesANameMapperPrefix(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithNamespace("orders"))[0]
	j := javaService(t, srv, redissonemu.Config{NameMapper: func(n string) string { return "orders:" + n }})
	other := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	for _, kind := range []string{"lock", "fair"} {
		t.Run(kind, func(t *testing.T) {
			name := "sku:" + kind
			jl, ol := j.Lock(name), other.Lock(name)
			m := exclusive(c.Mutex(name))
			if kind == "fair" {
				jl, ol, m = j.FairLock(name), other.FairLock(name), c.FairMutex(name)
			}
			if err := jl.Lock(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if srv.Do("EXISTS", "orders:"+name) != int64(1) {
				t.Fatalf("the Java hold is not at orders:%s", name)
			}
			if _, err := m.TryLock(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("TryLock beside the Java hold under the same prefix = %v, want ErrNotAcquired", err)
			}
			if ok, _ := ol.TryLock(ctx, 2, 0, 0); !ok {
				t.Fatal("a Java service without the prefix was kept out of another lock")
			}
			ol.Unlock(ctx, 2)
			jl.Unlock(ctx, 1)
			hctx, err := m.TryLock(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if ok, _ := jl.TryLock(ctx, 3, 0, 0); ok {
				t.Fatal("the Java thread got a lock we hold")
			}
			m.Unlock(hctx)
		})
	}
}

func TestRedissonEmu_FairMutexAndRFairLockExcludeEachOther(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	// (a short watchdog timeout: a waiter of ours that Redisson's purge
	// dropped comes back at its next renewal)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(3*time.Second))[0]
	j := javaService(t, srv, redissonemu.Config{})
	f := c.FairMutex(name)
	r := contend(t, 2*time.Second, mutexSide(f), javaLockSide(j.FairLock(name)), 1, false)
	if r.Overlaps != 0 {
		t.Fatalf("%d holds began while the other side held the lock", r.Overlaps)
	}
}

func TestRedissonEmu_RWMutexAndRReadWriteLockWritersKeepEveryoneOut(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	rw, jrw := c.RWMutex(name), j.ReadWriteLock(name)
	if err := jrw.WriteLock().Lock(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryRLock(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("our RLock beside a Java writer = %v", err)
	}
	if _, err := rw.TryLock(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("our Lock beside a Java writer = %v", err)
	}
	jrw.WriteLock().Unlock(ctx, 1)
	wctx, err := rw.TryLock(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := jrw.ReadLock().TryLock(ctx, 2, 0, 0); ok {
		t.Fatal("a Java reader entered beside our writer")
	}
	if ok, _ := jrw.WriteLock().TryLock(ctx, 2, 0, 0); ok {
		t.Fatal("a Java writer entered beside our writer")
	}
	rw.Unlock(wctx)
}

// A Java thread woken by an unlock message needs the message, its own
// scheduling and a round trip to take the lock; a Client's next holder
// (handed the lock, or a fresh Lock with one round trip) is quicker. Under
// sustained contention neither side may wait long: the Client lets the
// foreign waiters it counts go first when it frees the lock, and frees it at
// the end of every turn however its goroutines come and go. A loaded
// machine can stall either side on its own, so the bound is judged by the
// best of up to four windows; without the mechanism the Java threads wait
// for seconds in every one.
func TestRedissonEmu_MutexTurnsBoundAForeignWaitersWait(t *testing.T) {
	const bound = 500 * time.Millisecond
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	// A woken JVM thread of a loaded host runs a few milliseconds later
	// (WakeDelay): longer than a Client's head lets other Clients of this
	// package go first (yieldDelay).
	j := javaService(t, srv, redissonemu.Config{WakeDelay: 3 * time.Millisecond})
	var worst time.Duration
	for range 4 {
		r := contend(t, 2*time.Second, mutexSide(c.Mutex(name)), javaLockSide(j.Lock(name)), 1, false)
		if r.Overlaps != 0 {
			t.Fatalf("%d holds began while the other side held the lock", r.Overlaps)
		}
		w := max(r.LongestWait["go"], r.LongestWait["java"])
		if r.Share["java#0"] > 0 && r.Share["java#1"] > 0 && w <= bound {
			return
		}
		if worst == 0 || w < worst {
			worst = w
		}
	}
	t.Fatalf("in every window an acquisition waited longer than %v, at best %v", bound, worst)
}

// The turns count Redisson's subscribers of a Mutex's channel apart from
// the other Clients of this package, which subscribe to the channel's mark
// too: a Client lets only the former go first (foreignYield), or Clients of
// this package alone would hold the lock back from each other at every
// turn's end.
func TestRedissonEmu_MutexTurnsTellRedissonWaitersFromOtherClients(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	cs := instances(t, srv, 2)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	channel := "redisson_lock__channel:{" + name + "}"
	subscribers := func() int64 {
		n, _ := srv.Client().PubSubNumSub(context.Background(), channel).Result()
		return n[channel]
	}
	waited := make(chan error, 2)
	go func() {
		ctx, err := cs[1].Mutex(name).TryLock(context.Background(), 10*time.Second)
		if err == nil {
			err = cs[1].Mutex(name).Unlock(ctx)
		}
		waited <- err
	}()
	eventually(t, 5*time.Second, "the other Client's waiter subscribed", func() bool { return subscribers() == 1 })
	if n := lock.ForeignWaiters(cs[0], name); n != 0 {
		t.Fatalf("another Client of this package's waiting counts as %d foreign waiters, want 0", n)
	}
	j := javaService(t, srv, redissonemu.Config{})
	go func() {
		err := j.Lock(name).Lock(context.Background(), 1)
		if err == nil {
			err = j.Lock(name).Unlock(context.Background(), 1)
		}
		waited <- err
	}()
	eventually(t, 5*time.Second, "the Java waiter subscribed", func() bool { return subscribers() == 2 })
	if n := lock.ForeignWaiters(cs[0], name); n != 1 {
		t.Fatalf("a Redisson waiter beside another Client's counts as %d foreign waiters, want 1", n)
	}
	if err := cs[0].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedissonEmu_AJavaWaiterOnAHotMutexWaitsUnderHalfASecond(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	r := contend(t, 3*time.Second, mutexSide(c.Mutex(name)), javaLockSide(j.Lock(name)), 1, false)
	if r.Overlaps != 0 {
		t.Fatalf("%d overlapping holds", r.Overlaps)
	}
	for s, w := range r.LongestWait {
		if w > 500*time.Millisecond {
			t.Fatalf("an acquisition of the %s side waited %v", s, w)
		}
	}
}

// Not Redisson's: two Clients of ours with two goroutines each. A turn's
// handover count lives in the Client's wait queue, which empties at every
// handover between two goroutines, so on main a turn never ends and the
// other Client waits for a race it rarely wins (2.0 s measured).
func TestMutex_TwoClientsOfTwoGoroutinesEachWaitUnderHalfASecond(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	cs := instances(t, srv, 2)
	r := contendAs(t, 3*time.Second, [2]string{"a", "b"}, mutexSide(cs[0].Mutex(name)), mutexSide(cs[1].Mutex(name)), 1, false)
	if r.Overlaps != 0 {
		t.Fatalf("%d overlapping holds", r.Overlaps)
	}
	for s, w := range r.LongestWait {
		if w > 500*time.Millisecond {
			t.Fatalf("an acquisition of Client %s waited %v", s, w)
		}
	}
}

package lock_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// fairKeys returns the Redis keys of a fair lock's line.
func fairKeys(name string) (queue, timeouts string) {
	return "redisson_lock_queue:{" + name + "}", "redisson_lock_timeout:{" + name + "}"
}

func TestFairMutex_GrantsInArrivalOrderAcrossClients(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	queue, _ := fairKeys(name)
	held, err := clients[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	const n = 12
	type grant struct {
		who int
		at  time.Time
	}
	grants := make(chan grant, n)
	unlocked := make(chan time.Time, n+1)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := clients[i%len(clients)].FairMutex(name)
			ctx, err := m.Lock(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			grants <- grant{i, time.Now()}
			time.Sleep(2 * time.Millisecond)
			unlocked <- time.Now()
			if err := m.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
		// Arrival order is the order of places in line: wait for this one.
		eventually(t, 5*time.Second, "waiter queued", func() bool {
			return srv.Do("LLEN", queue) == int64(i+1)
		})
	}
	unlocked <- time.Now()
	if err := clients[0].FairMutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(grants)
	var handoffs []time.Duration
	for want := 0; want < n; want++ {
		g := <-grants
		if g.who != want {
			t.Fatalf("grant %d went to waiter %d: not arrival order", want, g.who)
		}
		handoffs = append(handoffs, g.at.Sub(<-unlocked))
	}
	sort.Slice(handoffs, func(i, j int) bool { return handoffs[i] < handoffs[j] })
	t.Logf("FIFO handoff (unlock -> next waiter holds): median %v, max %v",
		handoffs[len(handoffs)/2], handoffs[len(handoffs)-1])
	if handoffs[len(handoffs)-1] > 500*time.Millisecond {
		t.Fatalf("slowest handoff %v: waiters are not woken by the unlock", handoffs[len(handoffs)-1])
	}
}

func TestFairMutex_UnlockWakesOnlyTheNextWaiter(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	queue, _ := fairKeys(name)
	rdb := srv.Client()
	held, err := clients[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	got := make(chan int, n)
	release := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			m := clients[i%len(clients)].FairMutex(name)
			ctx, err := m.Lock(context.Background())
			if err != nil {
				t.Error(err)
				got <- -1
				return
			}
			got <- i
			<-release
			m.Unlock(ctx)
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return srv.Do("LLEN", queue) == int64(i+1) })
	}
	time.Sleep(50 * time.Millisecond) // every waiter subscribed and asleep
	before := commandCalls(t, rdb)
	clients[0].FairMutex(name).Unlock(held)
	if first := <-got; first != 0 {
		t.Fatalf("first grant to %d", first)
	}
	time.Sleep(100 * time.Millisecond) // let any herd show itself
	d := delta(before, commandCalls(t, rdb))
	// The unlock (1 call) and the next waiter's acquisition (1 call); a
	// herd would add one attempt per waiter.
	if d["evalsha"] > 3 {
		t.Fatalf("one unlock caused %d script calls with %d waiters: a herd (%v)", d["evalsha"], n, d)
	}
	close(release)
	for i := 1; i < n; i++ {
		<-got
	}
}

func TestFairMutex_UnlockerQueuesBehindWaiters(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	queue, _ := fairKeys(name)
	m := cs[0].FairMutex(name)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waiterGot := make(chan context.Context, 1)
	go func() {
		ctx, err := cs[1].FairMutex(name).Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		waiterGot <- ctx
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return srv.Do("LLEN", queue) == int64(1) })
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	// Re-lock at once: a plain lock could barge in before the woken waiter.
	if _, err := m.TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("the unlocker re-locked ahead of the waiter: %v", err)
	}
	ctx := <-waiterGot
	cs[1].FairMutex(name).Unlock(ctx)
}

func TestFairMutex_DeadWaiterIsSkippedAfterItsDeadline(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(600*time.Millisecond))
	name := lockName(t)
	queue, timeouts := fairKeys(name)
	held, err := cs[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A waiter of a process that died: first in line, never renewed.
	ms := time.Now().UnixMilli()
	srv.Do("RPUSH", queue, "ghost:1")
	srv.Do("ZADD", timeouts, ms+400, "ghost:1")
	got := make(chan time.Time, 1)
	go func() {
		ctx, err := cs[1].FairMutex(name).Lock(context.Background())
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		cs[1].FairMutex(name).Unlock(ctx)
	}()
	eventually(t, 5*time.Second, "waiter queued behind the ghost", func() bool { return srv.Do("LLEN", queue) == int64(2) })
	cs[0].FairMutex(name).Unlock(held) // wakes the ghost, who never comes
	select {
	case at, ok := <-got:
		if !ok {
			t.FailNow()
		}
		if d := at.Sub(time.UnixMilli(ms)); d > 3*time.Second {
			t.Fatalf("live waiter got the lock %v after the ghost's deadline was set (400ms)", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a dead waiter froze the lock")
	}
	if n := srv.Do("ZSCORE", timeouts, "ghost:1"); n != nil {
		t.Fatalf("the ghost's place is still there: %v", n)
	}
}

func TestFairMutex_LiveWaiterKeepsItsPlacePastTheWatchdogTimeout(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3, lock.WithWatchdogTimeout(1500*time.Millisecond))
	name := lockName(t)
	queue, _ := fairKeys(name)
	held, err := cs[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			ctx, err := cs[i].FairMutex(name).Lock(context.Background())
			if err != nil {
				t.Error(err)
				order <- -1
				return
			}
			order <- i
			cs[i].FairMutex(name).Unlock(ctx)
		}()
		eventually(t, 5*time.Second, "queued", func() bool { return srv.Do("LLEN", queue) == int64(i) })
	}
	time.Sleep(3200 * time.Millisecond) // over two watchdog timeouts: places survive only if renewed
	if n := srv.Do("LLEN", queue); n != int64(2) {
		t.Fatalf("line length %v after 3.2s, want 2: live waiters lost their places", n)
	}
	cs[0].FairMutex(name).Unlock(held)
	if a, b := <-order, <-order; a != 1 || b != 2 {
		t.Fatalf("served %d then %d, want 1 then 2", a, b)
	}
}

func TestFairMutex_TimedOutWaiterLeavesTheLineCleanly(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3)
	name := lockName(t)
	queue, timeouts := fairKeys(name)
	held, err := cs[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = cs[1].FairMutex(name).TryLock(context.Background(), 150*time.Millisecond)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if n := srv.Do("LLEN", queue); n != int64(0) {
		t.Fatalf("line length %v after the waiter gave up", n)
	}
	if n := srv.Do("ZCARD", timeouts); n != int64(0) {
		t.Fatalf("%v deadlines left after the waiter gave up", n)
	}
	// A cancelled waiter leaves too, and the next one is not held up by it.
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { _, err := cs[1].FairMutex(name).Lock(ctx); gaveUp <- err }()
	eventually(t, 5*time.Second, "queued", func() bool { return srv.Do("LLEN", queue) == int64(1) })
	next := make(chan error, 1)
	go func() {
		c, err := cs[2].FairMutex(name).Lock(context.Background())
		if err == nil {
			cs[2].FairMutex(name).Unlock(c)
		}
		next <- err
	}()
	eventually(t, 5*time.Second, "queued", func() bool { return srv.Do("LLEN", queue) == int64(2) })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	released := time.Now()
	cs[0].FairMutex(name).Unlock(held)
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("next waiter got in %v after the unlock: held up by the one that left", d)
	}
}

func TestFairMutex_CrashedHolderLockIsTakenAfterTheLease(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithWatchdogTimeout(time.Second))
	name := lockName(t)
	if _, err := cs[0].FairMutex(name).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	cs[0].Close()
	ctx, err := cs[1].FairMutex(name).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(crashed); d > 2500*time.Millisecond {
		t.Fatalf("taken %v after the crash, want about the 1s lease", d)
	}
	cs[1].FairMutex(name).Unlock(ctx)
}

func TestFairMutex_SharesHoldsAndTokensWithMutex(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	ctx, err := cs[0].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := fencing.FromContext(ctx)
	if !ok {
		t.Fatal("no token")
	}
	if _, err := cs[1].Mutex(name).TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a Mutex of the same name got in: %v", err)
	}
	inner, err := cs[0].Mutex(name).Lock(ctx) // re-enters the same hold
	if err != nil {
		t.Fatal(err)
	}
	if it, _ := fencing.FromContext(inner); it != tok {
		t.Fatalf("re-entry token %d, want %d", it, tok)
	}
	if n, _ := cs[0].Mutex(name).HoldCount(inner); n != 2 {
		t.Fatalf("hold count %d, want 2", n)
	}
	if err := cs[0].Mutex(name).Unlock(inner); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].FairMutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ctx2, err := cs[1].FairMutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if t2, _ := fencing.FromContext(ctx2); t2 <= tok {
		t.Fatalf("next token %d not above %d", t2, tok)
	}
	cs[1].FairMutex(name).Unlock(ctx2)
}

func TestFairMutex_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	var nilFair *lock.FairMutex
	cases := map[string]func() error{
		"empty name":      func() error { _, err := c.FairMutex("").Lock(bg); return err },
		"bad hash tag":    func() error { _, err := c.FairMutex("a{b").Lock(bg); return err },
		"negative wait":   func() error { _, err := c.FairMutex("x").TryLock(bg, -1); return err },
		"zero lease":      func() error { _, err := c.FairMutex("x").Lock(bg, lock.WithLease(0)); return err },
		"nil context":     func() error { _, err := c.FairMutex("x").Lock(nil); return err }, //nolint:staticcheck
		"nil fair mutex":  func() error { _, err := nilFair.Lock(bg); return err },
		"nil lock client": func() error { var nc *lock.Client; _, err := nc.FairMutex("x").Lock(bg); return err },
		"unlock nil ctx":  func() error { return c.FairMutex("x").Unlock(nil) }, //nolint:staticcheck
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if n := srv.Do("DBSIZE"); n != int64(0) {
		t.Fatalf("bad input created %v keys", n)
	}
}

// A Mutex and a FairMutex of one name exclude each other, so the final
// unlock of either wakes a waiter of the other at once: neither waits out
// the other's lease.
func TestFairMutex_AndMutexOfOneNameWakeEachOthersWaiters(t *testing.T) {
	type locker struct {
		lock   func(c *lock.Client, name string, wait time.Duration) (context.Context, error)
		unlock func(c *lock.Client, name string, ctx context.Context) error
	}
	mutex := locker{
		func(c *lock.Client, name string, wait time.Duration) (context.Context, error) {
			return c.Mutex(name).TryLock(context.Background(), wait)
		},
		func(c *lock.Client, name string, ctx context.Context) error { return c.Mutex(name).Unlock(ctx) },
	}
	fair := locker{
		func(c *lock.Client, name string, wait time.Duration) (context.Context, error) {
			return c.FairMutex(name).TryLock(context.Background(), wait)
		},
		func(c *lock.Client, name string, ctx context.Context) error { return c.FairMutex(name).Unlock(ctx) },
	}
	for _, tc := range []struct {
		name           string
		holder, waiter locker
		subscribed     func(srv *testenv.RedisServer, name string) bool // the waiter listens
	}{
		{"MutexUnlockWakesFairWaiter", mutex, fair, func(srv *testenv.RedisServer, name string) bool {
			chans, _ := srv.Do("PUBSUB", "CHANNELS", "redisson_lock__channel:{"+name+"}:*").([]any)
			return len(chans) == 1
		}},
		{"FairUnlockWakesMutexWaiter", fair, mutex, func(srv *testenv.RedisServer, name string) bool {
			n, _ := srv.Do("PUBSUB", "NUMSUB", "redisson_lock__channel:{"+name+"}").([]any)
			return len(n) == 2 && n[1] == int64(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.Redis(t)
			cs := instances(t, srv, 2)
			name := lockName(t)
			held, err := tc.holder.lock(cs[0], name, 0)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				at  time.Time
				err error
			}
			got := make(chan result, 1)
			go func() {
				ctx, err := tc.waiter.lock(cs[1], name, 5*time.Second)
				got <- result{time.Now(), err}
				if err == nil {
					tc.waiter.unlock(cs[1], name, ctx)
				}
			}()
			eventually(t, 5*time.Second, "waiter subscribed", func() bool { return tc.subscribed(srv, name) })
			unlocked := time.Now()
			if err := tc.holder.unlock(cs[0], name, held); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("waiter after the other kind's unlock: %v", r.err)
			}
			if d := r.at.Sub(unlocked); d > time.Second {
				t.Fatalf("waiter got the lock %v after the other kind's unlock: not woken", d)
			}
		})
	}
}

// The first waiter in a FairMutex's line gives up while a Mutex of the name
// holds it: the waiter behind it, first now, is told so, and the Mutex's
// unlock wakes it at once. A Mutex's release publishes on its own channel
// only, which the waiters of the line act on only when first: without being
// told, the second waiter would sleep until the first one's place was due
// (the watchdog timeout) and miss the unlock.
func TestFairMutex_WaiterFirstAfterTheHeadLeftIsWokenByMutexUnlock(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3)
	name := lockName(t)
	queue, _ := fairKeys(name)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	headGone := make(chan error, 1)
	go func() {
		_, err := cs[1].FairMutex(name).TryLock(context.Background(), 300*time.Millisecond)
		headGone <- err
	}()
	eventually(t, 5*time.Second, "head queued", func() bool { return srv.Do("LLEN", queue) == int64(1) })
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, err := cs[2].FairMutex(name).TryLock(context.Background(), 5*time.Second)
		got <- result{time.Now(), err}
		if err == nil {
			cs[2].FairMutex(name).Unlock(ctx)
		}
	}()
	eventually(t, 5*time.Second, "second waiter queued", func() bool { return srv.Do("LLEN", queue) == int64(2) })
	if err := <-headGone; !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("head's TryLock: %v, want ErrNotAcquired", err)
	}
	time.Sleep(100 * time.Millisecond) // the second waiter heard it is first
	unlocked := time.Now()
	if err := cs[0].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("second waiter after the Mutex's unlock: %v", r.err)
	}
	if d := r.at.Sub(unlocked); d > time.Second {
		t.Fatalf("second waiter got the lock %v after the Mutex's unlock: not woken", d)
	}
}

// A holder whose lease simply runs out publishes nothing; the first waiter
// tries when the lease ends, and every waiter behind it learns the lease of
// the holder ahead of it in time to try when that one runs out too: a line
// of holders that never unlock moves at the pace of their leases.
func TestFairMutex_WaitersFollowLeasesThatRunOut(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	name := lockName(t)
	queue, _ := fairKeys(name)
	const lease, n = 500 * time.Millisecond, 8
	if _, err := clients[0].FairMutex(name).TryLock(context.Background(), 0, lock.WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	type grant struct {
		who int
		at  time.Time
		err error
	}
	grants := make(chan grant, n)
	for i := 0; i < n; i++ {
		go func() {
			// Never unlocks: each hold ends with its lease.
			_, err := clients[i%len(clients)].FairMutex(name).TryLock(context.Background(), 10*time.Second, lock.WithLease(lease))
			grants <- grant{i, time.Now(), err}
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return srv.Do("LLEN", queue) == int64(i+1) })
	}
	prev := time.Now()
	for want := 0; want < n; want++ {
		g := <-grants
		if g.err != nil {
			t.Fatalf("waiter %d: %v", g.who, g.err)
		}
		if g.who != want {
			t.Fatalf("grant %d went to waiter %d: not arrival order", want, g.who)
		}
		if gap := g.at.Sub(prev); gap > lease+400*time.Millisecond {
			t.Fatalf("waiter %d got the lock %v after the one before it, whose lease was %v", g.who, gap, lease)
		}
		prev = g.at
	}
}

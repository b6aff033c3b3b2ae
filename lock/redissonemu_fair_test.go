package lock_test

// A FairMutex and Redisson's RFairLock (the redissonemu emulator) on one
// name stand in one line: Redisson's line, read and written with its
// meaning (deadlines counted from each waiter's wait, lowered by every
// acquisition), with our waiters' liveness in a key of ours.

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/redissonemu"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// lineScore returns member's deadline in the fair line of name.
func lineScore(t *testing.T, srv *testenv.RedisServer, name, member string) int64 {
	t.Helper()
	switch v := srv.Do("ZSCORE", redissonemu.Prefixed("redisson_lock_timeout", name), member).(type) {
	case float64:
		return int64(v)
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatal(err)
		}
		return int64(f)
	}
	t.Fatalf("%s has no deadline in the line of %s", member, name)
	return 0
}

// lineFields returns the fields of the fair line of name, first first.
func lineFields(srv *testenv.RedisServer, name string) []string {
	var out []string
	for _, v := range srv.Do("LRANGE", redissonemu.Prefixed("redisson_lock_queue", name), 0, -1).([]any) {
		out = append(out, v.(string))
	}
	return out
}

// lineLen reports whether the fair line of name is n long.
func lineLen(srv *testenv.RedisServer, name string, n int) func() bool {
	return func() bool { return srv.Do("LLEN", redissonemu.Prefixed("redisson_lock_queue", name)) == int64(n) }
}

// orderLog records who took a lock, in order.
type orderLog struct {
	mu    sync.Mutex
	order []string
}

func (o *orderLog) took(who string) {
	o.mu.Lock()
	o.order = append(o.order, who)
	o.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
}

func (o *orderLog) get() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.order...)
}

func TestRedissonEmu_FairLineKeepsArrivalOrderAcrossBoth(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	line := redissonemu.Prefixed("redisson_lock_queue", name)
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	took := func(who string) {
		mu.Lock()
		order = append(order, who)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	arrivals := []string{"go#1", "java#1", "go#2", "java#2", "go#3", "java#3"}
	for i, who := range arrivals {
		wg.Add(1)
		if who[0] == 'g' {
			go func() {
				defer wg.Done()
				hctx, err := c.FairMutex(name).Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				took(who)
				c.FairMutex(name).Unlock(hctx)
			}()
		} else {
			thread := int64(i + 1)
			go func() {
				defer wg.Done()
				if err := j.FairLock(name).Lock(ctx, thread); err != nil {
					t.Error(err)
					return
				}
				took(who)
				j.FairLock(name).Unlock(ctx, thread)
			}()
		}
		eventually(t, 5*time.Second, who+" in line", func() bool { return srv.Do("LLEN", line) == int64(i+1) })
	}
	// Redisson's acquisitions lower every deadline by the taker's wait (5
	// minutes): a line of ours whose deadlines do not follow that rule is
	// purged by the next Java attempt.
	j.FairLock(name).Unlock(ctx, 100)
	wg.Wait()
	for i := range arrivals {
		if i >= len(order) || order[i] != arrivals[i] {
			t.Fatalf("taken in the order %v, want the arrival order %v", order, arrivals)
		}
	}
}

func TestRedissonEmu_AFairLineOfBothIsFairAndNeverIdleUnderContention(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	r := contend(t, 3*time.Second, mutexSide(c.FairMutex(name)), javaLockSide(j.FairLock(name)), 1, false)
	if r.Overlaps != 0 {
		t.Fatalf("%d overlapping holds", r.Overlaps)
	}
	if who, f := r.MinShare(); len(r.Share) < 4 || f < 0.10 {
		t.Fatalf("%s got %.1f%% of the holds (shares %v), want every worker at least 10%%", who, 100*f, r.Share)
	}
	if r.LongestIdle > time.Second {
		t.Fatalf("the lock sat free %v while someone waited", r.LongestIdle)
	}
}

// Our acquisition does what Redisson's does to the line: every deadline
// left loses the taker's wait (WithFairLockWaitTimeout's 5 minutes here).
// Without it the Java waiters' deadlines keep the waits of ours that are
// gone, and a dead Java waiter holds the line that much longer.
func TestRedissonEmu_OurAcquisitionLowersEveryDeadlineByOurWait(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	held := make(chan context.Context, 1)
	go func() {
		hctx, err := c.FairMutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		held <- hctx
	}()
	eventually(t, 5*time.Second, "ours in line", lineLen(srv, name, 1))
	javaDone := make(chan error, 1)
	go func() {
		err := j.FairLock(name).Lock(ctx, 2)
		if err == nil {
			err = j.FairLock(name).Unlock(ctx, 2)
		}
		javaDone <- err
	}()
	eventually(t, 5*time.Second, "java in line", lineLen(srv, name, 2))
	before := lineScore(t, srv, name, j.Field(2))
	j.FairLock(name).Unlock(ctx, 100)
	hctx := <-held
	if hctx == nil {
		t.FailNow()
	}
	if got, want := lineScore(t, srv, name, j.Field(2)), before-lock.DefaultFairLockWaitTimeout.Milliseconds(); got != want {
		t.Fatalf("the Java waiter's deadline is %d after our acquisition, want %d (lowered by our wait)", got, want)
	}
	if err := c.FairMutex(name).Unlock(hctx); err != nil {
		t.Fatal(err)
	}
	if err := <-javaDone; err != nil {
		t.Fatal(err)
	}
}

// Our places are counted as Redisson counts its own: the deadline of the
// waiter ahead (first in an empty line: now plus the holder's lease) plus
// the waiter's wait, TryLock's wait when it gives one, else
// WithFairLockWaitTimeout.
func TestRedissonEmu_OurPlaceIsCountedAsRedissonCountsIt(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1, lock.WithFairLockWaitTimeout(7*time.Second))[0]
	j := javaService(t, srv, redissonemu.Config{FairLockWaitTimeout: 11 * time.Second})
	ctx := context.Background()
	if err := j.FairLock(name).LockLease(ctx, 100, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Run before the wait, also when a check fails: the waiters then finish.
	defer j.FairLock(name).Unlock(ctx, 100)
	start := time.Now().UnixMilli()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if hctx, err := c.FairMutex(name).Lock(ctx); err == nil {
			c.FairMutex(name).Unlock(hctx)
		}
	}()
	eventually(t, 5*time.Second, "ours in line", lineLen(srv, name, 1))
	first := lineScore(t, srv, name, lineFields(srv, name)[0])
	if lo, hi := start+10000+7000-1000, time.Now().UnixMilli()+10000+7000; first < lo || first > hi {
		t.Fatalf("the first waiter's deadline is %d, want now + the 10 s lease + our 7 s wait, in [%d, %d]", first, lo, hi)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := j.FairLock(name).Lock(ctx, 2); err == nil {
			j.FairLock(name).Unlock(ctx, 2)
		}
	}()
	eventually(t, 5*time.Second, "java in line", lineLen(srv, name, 2))
	if got := lineScore(t, srv, name, j.Field(2)); got != first+11000 {
		t.Fatalf("the Java waiter's deadline is %d, want ours + its 11 s wait = %d", got, first+11000)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if hctx, err := c.FairMutex(name).TryLock(ctx, 3*time.Second); err == nil {
			c.FairMutex(name).Unlock(hctx)
		}
	}()
	eventually(t, 5*time.Second, "our TryLock in line", lineLen(srv, name, 3))
	if got := lineScore(t, srv, name, lineFields(srv, name)[2]); got != first+11000+3000 {
		t.Fatalf("our TryLock's deadline is %d, want the Java waiter's + its 3 s wait = %d", got, first+14000)
	}
}

// A live waiter of ours keeps its place across Java acquisitions, each of
// which lowers every deadline by 5 minutes, while its Client's watchdog
// renews its liveness: the renewal never moves its Redisson deadline, or the
// next Java unlock drops it as stale.
func TestRedissonEmu_ARenewedWaiterOfOursKeepsItsPlaceAcrossJavaAcquisitions(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(600*time.Millisecond))[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	var o orderLog
	var wg sync.WaitGroup
	java := func(who string, thread int64) {
		defer wg.Done()
		if err := j.FairLock(name).Lock(ctx, thread); err != nil {
			t.Error(err)
			return
		}
		o.took(who)
		j.FairLock(name).Unlock(ctx, thread)
	}
	wg.Add(3)
	go java("java#2", 2)
	eventually(t, 5*time.Second, "java#2 in line", lineLen(srv, name, 1))
	go func() {
		defer wg.Done()
		hctx, err := c.FairMutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		o.took("go")
		c.FairMutex(name).Unlock(hctx)
	}()
	eventually(t, 5*time.Second, "go in line", lineLen(srv, name, 2))
	ours := lineFields(srv, name)[1]
	go java("java#3", 3)
	eventually(t, 5*time.Second, "java#3 in line", lineLen(srv, name, 3))
	time.Sleep(1400 * time.Millisecond) // over two watchdog timeouts: our waiter's liveness lasts only if renewed
	// Renewed about seven times, our deadline is still the one Redisson gave
	// the place: java#2's plus our wait. (The order below shows the same, but
	// not in every run: a renewal that moved it just before java#3 joined
	// moves java#3's too, both then go stale together at java#2's
	// acquisition, and either may take the emptied line first.)
	if got, want := lineScore(t, srv, name, ours), lineScore(t, srv, name, j.Field(2))+lock.DefaultFairLockWaitTimeout.Milliseconds(); got != want {
		t.Errorf("after renewals our waiter's deadline is %d, want java#2's + our wait = %d", got, want)
	}
	j.FairLock(name).Unlock(ctx, 100)
	wg.Wait()
	if got := strings.Join(o.get(), " "); got != "java#2 go java#3" {
		t.Fatalf("taken in the order %s, want java#2 go java#3", got)
	}
}

// A waiter of ours that died (its liveness is no longer renewed) is given up
// at its liveness deadline, long before its Redisson deadline, wherever it
// stands; it leaves as a waiter that gives up does, and the Java waiter
// behind it takes the lock.
func TestRedissonEmu_ADeadWaiterOfOursIsGivenUpAtItsLivenessDeadline(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(600*time.Millisecond))[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	// A waiter of a Client of ours that died: first in line, its Redisson
	// deadline 5 minutes away, its liveness 400 ms.
	now := time.Now().UnixMilli()
	srv.Do("RPUSH", redissonemu.Prefixed("redisson_lock_queue", name), "ghost:1")
	srv.Do("ZADD", redissonemu.Prefixed("redisson_lock_timeout", name), now+30000+300000, "ghost:1")
	srv.Do("ZADD", redissonemu.Prefixed("seckillguard_fair_alive", name), now+400, "ghost:1")
	srv.Do("HSET", redissonemu.Prefixed("seckillguard_fair_wait", name), "ghost:1", 300000)
	var o orderLog
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := j.FairLock(name).Lock(ctx, 2); err != nil {
			t.Error(err)
			return
		}
		o.took("java")
		j.FairLock(name).Unlock(ctx, 2)
	}()
	eventually(t, 5*time.Second, "java behind the ghost", lineLen(srv, name, 2))
	go func() {
		defer wg.Done()
		hctx, err := c.FairMutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		o.took("go")
		c.FairMutex(name).Unlock(hctx)
	}()
	eventually(t, 5*time.Second, "go behind java", lineLen(srv, name, 3))
	j.FairLock(name).Unlock(ctx, 100) // wakes the ghost, who never comes
	released := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a dead waiter of ours froze the line")
	}
	if d := time.Since(released); d > 3*time.Second {
		t.Fatalf("the line moved on %v after the unlock, want soon after the ghost's 400 ms liveness", d)
	}
	if got := strings.Join(o.get(), " "); got != "java go" {
		t.Fatalf("taken in the order %s, want java go", got)
	}
	if n := srv.Do("EXISTS", redissonemu.Prefixed("redisson_lock_queue", name), redissonemu.Prefixed("seckillguard_fair_alive", name),
		redissonemu.Prefixed("seckillguard_fair_wait", name)); n != int64(0) {
		t.Fatalf("%v line keys left behind", n)
	}
}

// A dead waiter of ours in the middle of the line is given up at its
// liveness deadline by the next call of any Client of ours on the name, not
// only once it is first: it leaves as a waiter that gives up does, the
// waiters behind it lowered by its wait, and those ahead keep their places.
func TestRedissonEmu_ADeadWaiterOfOursInMidLineIsGivenUpByTheNextCall(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	java := func(thread int64) {
		defer wg.Done()
		if err := j.FairLock(name).Lock(ctx, thread); err != nil {
			t.Error(err)
			return
		}
		j.FairLock(name).Unlock(ctx, thread)
	}
	wg.Add(1)
	go java(2)
	eventually(t, 5*time.Second, "java#2 in line", lineLen(srv, name, 1))
	// A waiter of a Client of ours that died, behind java#2: its liveness
	// runs out in 300 ms, its Redisson deadline in minutes.
	now := time.Now().UnixMilli()
	srv.Do("RPUSH", redissonemu.Prefixed("redisson_lock_queue", name), "ghost:1")
	srv.Do("ZADD", redissonemu.Prefixed("redisson_lock_timeout", name), lineScore(t, srv, name, j.Field(2))+300000, "ghost:1")
	srv.Do("ZADD", redissonemu.Prefixed("seckillguard_fair_alive", name), now+300, "ghost:1")
	srv.Do("HSET", redissonemu.Prefixed("seckillguard_fair_wait", name), "ghost:1", 300000)
	wg.Add(1)
	go java(3)
	eventually(t, 5*time.Second, "java#3 behind the ghost", lineLen(srv, name, 3))
	ahead, behind := lineScore(t, srv, name, j.Field(2)), lineScore(t, srv, name, j.Field(3))
	time.Sleep(400 * time.Millisecond)
	// The next call of ours: one attempt, which takes a place and leaves it.
	if _, err := c.FairMutex(name).TryLock(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
	}
	if got := strings.Join(lineFields(srv, name), " "); got != j.Field(2)+" "+j.Field(3) {
		t.Fatalf("line %s after our call, want java#2 java#3: the dead waiter kept its place", got)
	}
	if got := lineScore(t, srv, name, j.Field(2)); got != ahead {
		t.Fatalf("java#2's deadline moved from %d to %d", ahead, got)
	}
	if got := lineScore(t, srv, name, j.Field(3)); got != behind-300000 {
		t.Fatalf("java#3's deadline is %d, want %d less the dead waiter's wait", got, behind)
	}
	j.FairLock(name).Unlock(ctx, 100)
	wg.Wait()
}

// A dead Java waiter first in line keeps the free lock from everyone until
// its Redisson deadline (Redisson's own stuck fair lock). It is made loud:
// the inspector shows each waiter's side and deadline, and the Client logs
// the stuck line; our waiter takes the lock once that deadline passes.
func TestRedissonEmu_AStuckJavaHeadIsShownAndLogged(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	logs := &contextLog{}
	c := instances(t, srv, 1, lock.WithLogger(slog.New(logs)))[0]
	j := javaService(t, srv, redissonemu.Config{FairLockWaitTimeout: 3 * time.Second})
	ctx := context.Background()
	start := time.Now()
	if err := j.FairLock(name).LockLease(ctx, 100, 500*time.Millisecond); err != nil { // its JVM dies holding it
		t.Fatal(err)
	}
	jctx, interrupt := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() { gone <- j.FairLock(name).Lock(jctx, 2) }()
	eventually(t, 5*time.Second, "java in line", lineLen(srv, name, 1))
	interrupt() // the thread is gone; its place stays until its deadline
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted Java waiter: %v", err)
	}
	got := make(chan time.Time, 1)
	go func() {
		hctx, err := c.FairMutex(name).Lock(ctx)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		c.FairMutex(name).Unlock(hctx)
	}()
	eventually(t, 5*time.Second, "go in line", lineLen(srv, name, 2))
	in, err := c.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Queue) != 2 || in.Queue[0].Side() != "foreign" || in.Queue[1].Side() != "ours" {
		t.Fatalf("line %+v, want the Java waiter foreign and ours ours", in.Queue)
	}
	if d := in.Queue[0].Deadline; d <= 0 || d > 3500*time.Millisecond {
		t.Fatalf("the Java waiter's deadline is %v away, want its 3 s wait after the 500 ms lease", d)
	}
	if e := in.Queue[1].Expires; e <= 0 || e > lock.DefaultWatchdogTimeout {
		t.Fatalf("our waiter renews within %v, want within the watchdog timeout", e)
	}
	select {
	case at, ok := <-got:
		if !ok {
			t.FailNow()
		}
		if d := at.Sub(start); d > 5*time.Second {
			t.Fatalf("our waiter got the lock %v after the Java waiter joined, want soon after its deadline (3.5 s)", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("our waiter never got the lock after the Java waiter's deadline")
	}
	if _, ok := logs.find("foreign client's"); !ok {
		t.Fatal("the stuck line was not logged")
	}
}

// A waiter of ours that gives up leaves as Redisson's does: every waiter
// behind it has its deadline lowered by the leaver's wait (TryLock's here).
func TestRedissonEmu_OurWaiterThatGivesUpLowersTheDeadlinesBehindIt(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	if err := j.FairLock(name).Lock(ctx, 100); err != nil {
		t.Fatal(err)
	}
	gaveUp := make(chan error, 1)
	go func() { _, err := c.FairMutex(name).TryLock(ctx, 400*time.Millisecond); gaveUp <- err }()
	eventually(t, 5*time.Second, "ours in line", lineLen(srv, name, 1))
	javaDone := make(chan error, 1)
	go func() {
		err := j.FairLock(name).Lock(ctx, 2)
		if err == nil {
			err = j.FairLock(name).Unlock(ctx, 2)
		}
		javaDone <- err
	}()
	eventually(t, 5*time.Second, "java in line", lineLen(srv, name, 2))
	before := lineScore(t, srv, name, j.Field(2))
	if err := <-gaveUp; !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
	}
	if got := lineScore(t, srv, name, j.Field(2)); got != before-400 {
		t.Fatalf("the Java waiter's deadline is %d after ours gave up, want %d - 400", got, before)
	}
	j.FairLock(name).Unlock(ctx, 100)
	if err := <-javaDone; err != nil {
		t.Fatal(err)
	}
}

// A re-entry runs the line's purge too, with the Client's clock: it works
// while others wait in line (a re-entry once sent the script too few
// arguments, and failed only when the line was not empty).
func TestFairMutex_ReentersWhileOthersWaitInLine(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()
	f := c.FairMutex(name)
	hctx, err := f.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	javaDone := make(chan error, 1)
	go func() {
		err := j.FairLock(name).Lock(ctx, 2)
		if err == nil {
			err = j.FairLock(name).Unlock(ctx, 2)
		}
		javaDone <- err
	}()
	eventually(t, 5*time.Second, "java in line", lineLen(srv, name, 1))
	inner, err := f.Lock(hctx)
	if err != nil {
		t.Fatalf("re-entry with a waiter in line: %v", err)
	}
	if err := f.Unlock(inner); err != nil {
		t.Fatal(err)
	}
	if err := f.Unlock(hctx); err != nil {
		t.Fatal(err)
	}
	if err := <-javaDone; err != nil {
		t.Fatal(err)
	}
}

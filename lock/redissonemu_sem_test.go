package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/redissonemu"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A Semaphore and Redisson's RPermitExpirableSemaphore of one name: one
// count of permits, permits of either side counted by the other, releases
// and dead permits of either side coming back to the other.

// sharedSemaphore starts a Redis with a Client of ours and an emulated Java
// service on it, and returns the Java side's RPermitExpirableSemaphore of
// the test's name with the given permits set (trySetPermits).
func sharedSemaphore(t *testing.T, permits int, cfg redissonemu.Config) (*testenv.RedisServer, *lock.Client, *redissonemu.PermitExpirableSemaphore, string) {
	t.Helper()
	srv := testenv.Redis(t)
	name := lockName(t)
	c := instances(t, srv, 1)[0]
	p := javaService(t, srv, cfg).PermitExpirableSemaphore(name)
	if ok, err := p.TrySetPermits(context.Background(), permits); err != nil || !ok {
		t.Fatalf("trySetPermits = %v, %v", ok, err)
	}
	return srv, c, p, name
}

func TestRedissonEmu_SemaphoreCountsPermitsWithRPermitExpirableSemaphore(t *testing.T) {
	_, c, p, name := sharedSemaphore(t, 2, redissonemu.Config{})
	ctx := context.Background()
	id, err := p.Acquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Semaphore(name, 2)
	hctx, err := s.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatalf("our permit beside one Java permit of 2: %v", err)
	}
	if got, _ := p.TryAcquire(ctx, 0, 0); got != "" {
		t.Fatal("a third permit of 2 was granted to Java")
	}
	if _, err := c.Semaphore(name, 2).TryAcquire(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a third permit of 2 for us: %v, want ErrNotAcquired", err)
	}
	waited := make(chan string, 1)
	go func() { got, _ := p.TryAcquire(ctx, 5*time.Second, 0); waited <- got }()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := s.Release(hctx); err != nil {
		t.Fatal(err)
	}
	// Redisson lets as many of its waiters try as the message says permits
	// are free: our release must announce the count, not merely publish.
	if got := <-waited; got == "" || time.Since(released) > time.Second {
		t.Fatalf("the Java waiter got %q %v after our release", got, time.Since(released))
	}
	p.Release(ctx, id)
}

func TestRedissonEmu_ASemaphoreOfAnotherCountThanRedisIsInvalid(t *testing.T) {
	srv, c, _, name := sharedSemaphore(t, 3, redissonemu.Config{})
	ctx := context.Background()
	_, err := c.Semaphore(name, 2).TryAcquire(ctx, 0)
	if !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("Semaphore(name, 2) where Redis holds 3 permits: %v, want an error matching ErrInvalid", err)
	}
	t.Log(err)
	if n := srv.Do("ZCARD", permitsKey(name)); n != int64(0) {
		t.Fatalf("the refused acquisition took a permit (%v handed out)", n)
	}
	if free := srv.Do("GET", name); free != "3" {
		t.Fatalf("free permits after the refusal: %v, want 3", free)
	}
}

func TestRedissonEmu_ADeadPermitOfOursComesBackForJava(t *testing.T) {
	_, c, p, name := sharedSemaphore(t, 1, redissonemu.Config{})
	ctx := context.Background()
	if _, err := c.Semaphore(name, 1).Acquire(ctx, lock.WithLease(400*time.Millisecond)); err != nil { // never released
		t.Fatal(err)
	}
	start := time.Now()
	id, err := p.TryAcquire(ctx, 5*time.Second, 0)
	if err != nil || id == "" {
		t.Fatalf("Java acquire after our lease = %q, %v", id, err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 1500*time.Millisecond {
		t.Fatalf("the permit came back after %v, want when our 400 ms lease ended", d)
	}
}

func TestRedissonEmu_ADeadJavaPermitComesBackForUs(t *testing.T) {
	srv, c, p, name := sharedSemaphore(t, 1, redissonemu.Config{})
	ctx := context.Background()
	if id, err := p.Acquire(ctx, 400*time.Millisecond); err != nil || id == "" { // never released
		t.Fatalf("Java acquire = %q, %v", id, err)
	}
	s := c.Semaphore(name, 1)
	if _, err := s.TryAcquire(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("beside a live Java permit of 1: %v, want ErrNotAcquired", err)
	}
	start := time.Now()
	hctx, err := s.TryAcquire(ctx, 3*time.Second)
	if err != nil {
		t.Fatalf("after the Java permit's lease: %v", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 1200*time.Millisecond {
		t.Fatalf("the permit came back after %v, want when the Java permit's 400 ms lease ended", d)
	}
	if err := s.Release(hctx); err != nil {
		t.Fatal(err)
	}
	if free := srv.Do("GET", name); free != "1" {
		t.Fatalf("free permits after our release: %v, want 1 (the dead Java permit counted back once)", free)
	}
}

func TestRedissonEmu_AJavaReleaseWakesOurWaiter(t *testing.T) {
	_, c, p, name := sharedSemaphore(t, 1, redissonemu.Config{})
	ctx := context.Background()
	id, err := p.Acquire(ctx, 0) // no lease: nothing but its release frees it
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		hctx, err := c.Semaphore(name, 1).TryAcquire(ctx, 5*time.Second)
		if err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		c.Semaphore(name, 1).Release(hctx)
	}()
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	if err := p.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
	if at := <-got; at.IsZero() || at.Sub(released) > 300*time.Millisecond {
		t.Fatalf("our waiter got the permit %v after the Java release, want at once", at.Sub(released))
	}
}

func TestSemaphore_ACountOfOursExpiresWhenIdleAndRedissonsNever(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	const watchdog = 2 * time.Second
	c := instances(t, srv, 1, lock.WithWatchdogTimeout(watchdog))[0]
	j := javaService(t, srv, redissonemu.Config{})
	ctx := context.Background()

	s := c.Semaphore(name+":ours", 2)
	hctx, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(hctx); err != nil {
		t.Fatal(err)
	}
	ttl, _ := srv.Do("PTTL", name+":ours").(int64)
	if ttl <= 0 || ttl > int64(2*watchdog/time.Millisecond) {
		t.Fatalf("a count this package made: PTTL %d ms, want an expiry of at most two leases", ttl)
	}

	j.PermitExpirableSemaphore(name+":java").TrySetPermits(ctx, 2)
	s = c.Semaphore(name+":java", 2)
	if hctx, err = s.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(watchdog / 2) // a renewal
	if err := s.Release(hctx); err != nil {
		t.Fatal(err)
	}
	if ttl := srv.Do("PTTL", name+":java"); ttl != int64(-1) {
		t.Fatalf("a count Redisson's trySetPermits made: PTTL %v after our permit, want none (-1)", ttl)
	}
}

// Two goroutines and two Java threads on 2 permits: never more than 2
// holders, and every worker near its fair share (a quarter): a Redisson
// waiter, whose woken JVM thread runs a few milliseconds later (WakeDelay),
// loses most races to this Client's next acquisition without its turns (see
// permitTurn): about 15% each here, under 10% with the real client.
func TestRedissonEmu_SemaphoreAndRPermitExpirableSemaphoreNeverOverGrantUnderContention(t *testing.T) {
	srv, c, p, name := sharedSemaphore(t, 2, redissonemu.Config{WakeDelay: 8 * time.Millisecond})
	s := c.Semaphore(name, 2)
	ours := func(ctx context.Context, _ int) (func() error, bool, error) {
		hctx, err := s.Acquire(ctx)
		return func() error { return s.Release(hctx) }, true, err
	}
	java := func(ctx context.Context, _ int) (func() error, bool, error) {
		id, err := p.Acquire(ctx, 10*time.Second)
		return func() error { return p.Release(context.Background(), id) }, true, err
	}
	best := 0.0
	for range 3 {
		r := contend(t, 2*time.Second, ours, java, 2, false)
		if r.Overlaps != 0 || r.MostAtOnce > 2 {
			t.Fatalf("%d holds beyond the 2 permits, at most %d at once", r.Overlaps, r.MostAtOnce)
		}
		if free := srv.Do("GET", name); free != "2" {
			t.Fatalf("free permits after every release: %v, want 2", free)
		}
		least := 1.0
		for _, n := range r.Share {
			least = min(least, float64(n)/float64(r.Holds))
		}
		if len(r.Share) == 4 && least >= 0.18 {
			return
		}
		best = max(best, least)
	}
	t.Fatalf("in every window a worker had under 18%% of the holds, at best %.0f%%", 100*best)
}

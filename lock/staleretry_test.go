package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// retriedUntilTheLeaseEnds waits for held, whose final Unlock failed at t0
// and whose releases keep failing, to end, and checks that it was not
// declared lost while its key still lived in Redis (held by nobody until
// then): the retry in the background goes on until the lease the hold has
// in Redis ends.
func retriedUntilTheLeaseEnds(t *testing.T, direct *redis.Client, name string, held context.Context, t0 time.Time) {
	t.Helper()
	select {
	case <-held.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("never ended")
	}
	pttl := direct.PTTL(context.Background(), name).Val()
	t.Logf("owner told %v after the first failure: %v; the key's PTTL then: %v", time.Since(t0), context.Cause(held), pttl)
	if pttl > 200*time.Millisecond {
		t.Fatalf("the hold was declared lost while its key still lives %v in Redis (held by nobody)", pttl)
	}
}

// The retry in the background of a failed final Unlock, started before a
// re-entry, stops with it: when the owner then fails its final Unlock
// again, the retry of that failure, with the lease the hold has since, is
// the one that goes on, and the first does not declare the hold lost at
// the end of the lease it started with.
func TestFaults_StaleReleaseRetryLeavesTheHoldToTheCurrentOne(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	srv := testenv.Redis(t)
	direct := srv.Client()
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	refuse := &refusedCalls{match: isRelease, dial: true}
	rdb.AddHook(refuse)
	c := lock.New(rdb, lock.WithWatchdogTimeout(timeout))
	defer c.Close()
	name := lockName(t)
	m := c.Mutex(name)
	bg := context.Background()
	held, err := m.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(1 << 20)
	t0 := time.Now()
	if err := m.Unlock(held); err == nil {
		t.Fatal("unlock succeeded")
	}
	time.Sleep(time.Until(t0.Add(450 * time.Millisecond))) // between the retry's wakes at 350ms and 750ms
	again, err := m.Lock(held)
	if err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(0)
	if err := m.Unlock(again); err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(1 << 20)
	if err := m.Unlock(held); err == nil {
		t.Fatal("second final unlock succeeded")
	}
	retriedUntilTheLeaseEnds(t, direct, name, held, t0)
}

// The retry in the background of a fixed hold's failed final Unlock goes
// on until the hold's deadline, as a re-entry WithLease extended it, not
// until the lease the hold was first taken with ends.
func TestFaults_ReleaseRetryOfAnExtendedFixedHoldLastsToItsDeadline(t *testing.T) {
	srv := testenv.Redis(t)
	direct := srv.Client()
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	refuse := &refusedCalls{match: isRelease, dial: true}
	rdb.AddHook(refuse)
	c := lock.New(rdb)
	defer c.Close()
	name := lockName(t)
	m := c.Mutex(name)
	held, err := m.Lock(context.Background(), lock.WithLease(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.Lock(held, lock.WithLease(1500*time.Millisecond)) // extends the hold to 1.5s
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(again); err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(1 << 20)
	t0 := time.Now()
	if err := m.Unlock(held); err == nil {
		t.Fatal("final unlock succeeded")
	}
	retriedUntilTheLeaseEnds(t, direct, name, held, t0)
}

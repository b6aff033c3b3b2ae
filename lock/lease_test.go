package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A longer lease on a re-entry extends a fixed hold: the context lives on
// past the first lease.
func TestLease_ReentryWithALongerLeaseExtendsAFixedHold(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	outer, err := m.Lock(context.Background(), lock.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	inner, err := m.Lock(outer, lock.WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // past the first lease
	if inner.Err() != nil {
		t.Fatalf("the hold ended after %v with its first lease: %v", time.Since(start), context.Cause(inner))
	}
	if d, _ := m.TTL(context.Background()); d < 800*time.Millisecond {
		t.Fatalf("TTL %v, want what is left of the 2s lease", d)
	}
	<-inner.Done()
	if d := time.Since(start); d < 1900*time.Millisecond || d > 4*time.Second {
		t.Fatalf("context ended after %v, want about 2s", d)
	}
	if err := m.Unlock(inner); err != nil && !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock of the inner level after the lease ran out = %v", err)
	}
	if err := m.Unlock(outer); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("final Unlock after the lease ran out = %v, want ErrLost", err)
	}
}

// A re-entry without options leaves the hold as it is: a fixed lease keeps
// its deadline (a helper that re-enters cannot extend it without saying so).
func TestLease_ReentryWithoutOptionsKeepsAFixedDeadline(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	start := time.Now()
	outer, err := m.Lock(context.Background(), lock.WithLease(400*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock(outer); err != nil {
		t.Fatal(err)
	}
	select {
	case <-outer.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("a re-entry without options extended the fixed lease")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("ended after %v, want about its 400ms lease", d)
	}
}

package lock

import (
	"context"
	"errors"
	"testing"
	"time"
)

type allocTestKey struct{}

// A release is sent on its hold's context without the cancellation, as
// context.WithoutCancel would give it: the values are there, the
// cancellation and its cause are not.
func TestHold_DetachedContextIsWithoutCancel(t *testing.T) {
	parent := context.WithValue(context.Background(), allocTestKey{}, "request")
	h := &hold{name: "x", hk: heldKey{key: "x"}, kind: (*Mutex)(nil)}
	h.begin(parent, time.Now())
	d := h.detach(h.ctx)
	if d != &h.detached {
		t.Fatalf("detach(h.ctx) = %v, want the hold's own detached context", d)
	}
	h.cancel(ErrReleased)
	if d.Err() != nil || d.Done() != nil || context.Cause(d) != nil {
		t.Fatalf("detached context: Err %v, Done %v, Cause %v; want none", d.Err(), d.Done(), context.Cause(d))
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached context has a deadline")
	}
	if d.Value(allocTestKey{}) != "request" || heldBy(d, h.hk) != h {
		t.Fatal("detached context lost the values of the hold's context")
	}
	if !errors.Is(context.Cause(h.ctx), ErrReleased) {
		t.Fatalf("hold context's cause %v", context.Cause(h.ctx))
	}
	if c, cancel := context.WithCancel(d); c.Err() != nil {
		t.Fatal("a context derived from the detached one is cancelled")
	} else {
		cancel()
	}
	other := context.WithValue(h.ctx, allocTestKey{}, "other")
	if d := h.detach(other); d == &h.detached || d.Value(allocTestKey{}) != "other" || d.Err() != nil {
		t.Fatal("detach of another context")
	}
}

// A hold's semaphore lets one operation in at a time, in the order they
// came, and a waiter whose context ends gives up its place, without taking
// the semaphore from the next one.
func TestHold_SemaphoreOrderAndCancel(t *testing.T) {
	var s holdSem
	if err := s.take(context.Background()); err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.take(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire with an ended context of a busy semaphore: %v", err)
	}
	gone, leave := context.WithCancel(context.Background())
	got := make(chan int, 3)
	started := make(chan struct{})
	go func() { close(started); _ = s.take(gone); got <- 0 }()
	<-started
	for waitFor := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := len(s.waiters)
		s.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatal("the first waiter never waited")
		}
	}
	for i := 1; i <= 2; i++ {
		go func() {
			for {
				s.mu.Lock()
				n := len(s.waiters)
				s.mu.Unlock()
				if n == i {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if err := s.take(context.Background()); err != nil {
				t.Error(err)
			}
			got <- i
			s.give()
		}()
		for waitFor := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			s.mu.Lock()
			n := len(s.waiters)
			s.mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(waitFor) {
				t.Fatalf("waiter %d never waited", i)
			}
		}
	}
	leave()
	if w := <-got; w != 0 {
		t.Fatalf("waiter %d came first, want the one that gave up", w)
	}
	select {
	case w := <-got:
		t.Fatalf("waiter %d entered a busy semaphore", w)
	case <-time.After(20 * time.Millisecond):
	}
	s.give()
	if a, b := <-got, <-got; a != 1 || b != 2 {
		t.Fatalf("waiters entered in order %d, %d; want 1, 2", a, b)
	}
	if err := s.take(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.give()
	if s.busy || len(s.waiters) != 0 {
		t.Fatalf("semaphore left busy %v with %d waiters", s.busy, len(s.waiters))
	}
}

package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// events records what an Observer is told.
type events struct {
	mu  sync.Mutex
	all []lock.Event
}

func (e *events) observe(ev lock.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// of returns the types of the events of the hold with token tok, in order,
// renewals left out.
func (e *events) of(tok fencing.Token) []lock.EventType {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []lock.EventType
	for _, ev := range e.all {
		if ev.Token == tok && ev.Type != lock.EventRenewed {
			out = append(out, ev.Type)
		}
	}
	return out
}

func (e *events) find(tok fencing.Token, t lock.EventType) (lock.Event, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, ev := range e.all {
		if ev.Token == tok && ev.Type == t {
			return ev, i
		}
	}
	return lock.Event{}, -1
}

func sameTypes(a, b []lock.EventType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestObserver_AWaitIsAcquiredWithItsWaitThenReleased: a Client that waits
// for another's lock reports acquired, with the time it waited, then
// released.
func TestObserver_AWaitIsAcquiredWithItsWaitThenReleased(t *testing.T) {
	srv := testenv.Redis(t)
	var ev events
	holder := instances(t, srv, 1)[0]
	waiter := instances(t, srv, 1, lock.WithObserver(ev.observe))[0]
	name := lockName(t)
	held, err := holder.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan context.Context, 1)
	go func() {
		ctx, err := waiter.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- ctx
	}()
	unlockCh := "redisson_lock__channel:{" + name + "}"
	inspectUntil(t, holder, name, "the waiter subscribed", func(in *lock.Inspection) bool { return channel(in, unlockCh) == 1 })
	// The waiter's Lock was called before it subscribed, and it cannot
	// acquire before the Unlock: its wait is at least the time between.
	seen := time.Now()
	time.Sleep(50 * time.Millisecond)
	waited := time.Since(seen)
	holder.Mutex(name).Unlock(held)
	ctx := <-got
	if err := waiter.Mutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	tok, _ := fencing.FromContext(ctx)
	if types := ev.of(tok); !sameTypes(types, []lock.EventType{lock.EventAcquired, lock.EventReleased}) {
		t.Fatalf("events %v, want acquired, released", types)
	}
	acq, _ := ev.find(tok, lock.EventAcquired)
	if acq.Wait < waited || acq.Kind != lock.KindMutex || acq.Name != name {
		t.Errorf("acquired %+v, want a mutex event with a wait of at least %v", acq, waited)
	}
}

// TestObserver_AHandoverIsToldByBothHolds: inside one Client the releasing
// hold reports handed_over then released; the waiter it handed the lock to
// reports acquired after that handover.
func TestObserver_AHandoverIsToldByBothHolds(t *testing.T) {
	srv := testenv.Redis(t)
	var ev events
	c := instances(t, srv, 1, lock.WithObserver(ev.observe))[0]
	name := lockName(t)
	first, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan context.Context, 1)
	go func() {
		ctx, err := c.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- ctx
	}()
	unlockCh := "redisson_lock__channel:{" + name + "}"
	inspectUntil(t, c, name, "the second goroutine waiting", func(in *lock.Inspection) bool { return channel(in, unlockCh) == 1 })
	// Subscribed, the waiter tries once more (an unlock may have come in
	// between); a release meanwhile frees the lock rather than hand it to
	// a waiter in the middle of its attempt. Its three script calls (the
	// holder's, its first try, the try after subscribing) mark it asleep.
	eventually(t, 5*time.Second, "the waiter's attempt after subscribing", func() bool {
		return commandCalls(t, srv.Client())["evalsha"] >= 3
	})
	time.Sleep(20 * time.Millisecond) // its reply on its way back
	c.Mutex(name).Unlock(first)
	second := <-got
	c.Mutex(name).Unlock(second)

	t1, _ := fencing.FromContext(first)
	t2, _ := fencing.FromContext(second)
	if types := ev.of(t1); !sameTypes(types, []lock.EventType{lock.EventAcquired, lock.EventHandedOver, lock.EventReleased}) {
		t.Errorf("the first hold's events %v, want acquired, handed_over, released", types)
	}
	if types := ev.of(t2); !sameTypes(types, []lock.EventType{lock.EventAcquired, lock.EventReleased}) {
		t.Errorf("the second hold's events %v, want acquired, released", types)
	}
	_, handed := ev.find(t1, lock.EventHandedOver)
	_, acquired := ev.find(t2, lock.EventAcquired)
	if handed < 0 || acquired < handed {
		t.Errorf("the second hold acquired (event %d) before the handover (event %d)", acquired, handed)
	}
}

// TestObserver_ALossIsToldOnceAfterRenewals: a hold renewed by the watchdog
// whose key is deleted reports acquired, renewals, then lost with a cause
// matching ErrLost, and nothing after.
func TestObserver_ALossIsToldOnceAfterRenewals(t *testing.T) {
	srv := testenv.Redis(t)
	var ev events
	c := instances(t, srv, 1, lock.WithObserver(ev.observe), lock.WithWatchdogTimeout(300*time.Millisecond))[0]
	name := lockName(t)
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := fencing.FromContext(ctx)
	eventually(t, 5*time.Second, "a renewal", func() bool { _, i := ev.find(tok, lock.EventRenewed); return i >= 0 })
	srv.Do("DEL", name)
	<-ctx.Done()
	if err := c.Mutex(name).Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Errorf("Unlock of the lost hold: %v", err)
	}
	if types := ev.of(tok); !sameTypes(types, []lock.EventType{lock.EventAcquired, lock.EventLost}) {
		t.Fatalf("events %v, want acquired, lost (renewals aside)", types)
	}
	lost, li := ev.find(tok, lock.EventLost)
	_, ri := ev.find(tok, lock.EventRenewed)
	if !errors.Is(lost.Cause, lock.ErrLost) || lost.Held <= 0 || ri > li {
		t.Errorf("lost %+v (event %d, first renewal %d), want a cause matching ErrLost after the renewals", lost, li, ri)
	}
}

// TestObserver_EventsCarryTheHoldsContextAndOwner: every event of a hold
// carries the context it was taken with (a tracer finds the caller's span
// there) and the hold's owner field, the same from acquired to released
// and another for the next hold; every Observer given is told.
func TestObserver_EventsCarryTheHoldsContextAndOwner(t *testing.T) {
	srv := testenv.Redis(t)
	var first, second events
	c := instances(t, srv, 1, lock.WithObserver(first.observe), lock.WithObserver(second.observe))[0]
	name := lockName(t)
	for _, id := range []string{"req-1", "req-2"} {
		ctx, err := c.Mutex(name).Lock(context.WithValue(context.Background(), requestIDKey{}, id))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Mutex(name).Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, ev := range []*events{&first, &second} {
		ev.mu.Lock()
		all := append([]lock.Event(nil), ev.all...)
		ev.mu.Unlock()
		if len(all) != 4 {
			t.Fatalf("observer %d was told %d events, want 4 (acquired, released twice)", i+1, len(all))
		}
		for j, e := range all {
			want := []string{"req-1", "req-2"}[j/2]
			if id, _ := e.Context.Value(requestIDKey{}).(string); id != want {
				t.Errorf("observer %d, event %d (%v): context with request id %q, want %q", i+1, j, e.Type, id, want)
			}
		}
		if all[0].Owner == "" || all[0].Owner != all[1].Owner || all[2].Owner != all[3].Owner || all[0].Owner == all[2].Owner {
			t.Errorf("observer %d: owners %q %q %q %q, want one per hold, each in both of its events",
				i+1, all[0].Owner, all[1].Owner, all[2].Owner, all[3].Owner)
		}
	}
}

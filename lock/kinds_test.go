package lock_test

import (
	"context"
	"slices"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// An Event's Kind and Mode are the ones Inspect reports for the same hold:
// observers, metrics and the inspector speak one vocabulary, lock.Kind.
func TestObserver_KindIsWhatInspectReports(t *testing.T) {
	srv := testenv.Redis(t)
	var seen events
	c := lock.New(srv.Client(), lock.WithObserver(seen.observe), lock.WithNamespace("ns"))
	defer c.Close()
	ctx := context.Background()
	for name, take := range map[string]func(string) (context.Context, func() error, error){
		"mutex": func(n string) (context.Context, func() error, error) {
			got, err := c.Mutex(n).Lock(ctx)
			return got, func() error { return c.Mutex(n).Unlock(got) }, err
		},
		"fair": func(n string) (context.Context, func() error, error) {
			got, err := c.FairMutex(n).Lock(ctx)
			return got, func() error { return c.FairMutex(n).Unlock(got) }, err
		},
		"read": func(n string) (context.Context, func() error, error) {
			got, err := c.RWMutex(n).RLock(ctx)
			return got, func() error { return c.RWMutex(n).RUnlock(got) }, err
		},
		"write": func(n string) (context.Context, func() error, error) {
			got, err := c.RWMutex(n).Lock(ctx)
			return got, func() error { return c.RWMutex(n).Unlock(got) }, err
		},
		"permit": func(n string) (context.Context, func() error, error) {
			got, err := c.Semaphore(n, 2).Acquire(ctx)
			return got, func() error { return c.Semaphore(n, 2).Release(got) }, err
		},
	} {
		n := lockName(t) + ":" + name
		_, release, err := take(n)
		if err != nil {
			t.Fatal(name, err)
		}
		in, err := c.Inspect(ctx, n)
		if err != nil {
			t.Fatal(name, err)
		}
		if err := release(); err != nil {
			t.Fatal(name, err)
		}
		seen.mu.Lock()
		var got []lock.Event
		for _, e := range seen.all {
			if e.Name == c.Key(n) {
				got = append(got, e)
			}
		}
		seen.mu.Unlock()
		if len(got) == 0 {
			t.Fatalf("%s: no event named %q", name, c.Key(n))
		}
		for _, e := range got {
			if e.Kind != in.Kind || e.Mode != in.Mode || !slices.Contains(lock.Kinds(), e.Kind) {
				t.Errorf("%s: %v event of kind %q mode %q; Inspect says kind %q mode %q (Kinds %v)", name, e.Type, e.Kind, e.Mode, in.Kind, in.Mode, lock.Kinds())
			}
		}
	}
}

// Kinds and EventTypes hand out copies: a caller cannot change what the
// next caller (a metrics package creating its series) is given.
func TestKindsAndEventTypesAreTheCallersCopies(t *testing.T) {
	k, e := lock.Kinds(), lock.EventTypes()
	k[0], e[0] = "changed", 0
	if lock.Kinds()[0] != lock.KindMutex || lock.EventTypes()[0] != lock.EventAcquired {
		t.Fatalf("Kinds %v, EventTypes %v after a caller changed its copies", lock.Kinds(), lock.EventTypes())
	}
}

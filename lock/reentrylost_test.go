package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A hold that a re-entry is the first to find gone (force-unlocked, before
// any renewal could notice) ends with cause ErrLost, for every kind: its
// context says so under errors.Is, and the Observer is told EventLost.
func TestReentry_HoldFoundGoneEndsWithErrLost(t *testing.T) {
	forEachKind(t, func(t *testing.T, k reentryKind) {
		srv := testenv.Redis(t)
		var mu sync.Mutex
		var lost []lock.Event
		c := lock.New(srv.Client(), lock.WithObserver(func(e lock.Event) {
			if e.Type == lock.EventLost {
				mu.Lock()
				lost = append(lost, e)
				mu.Unlock()
			}
		})) // the default watchdog timeout: no renewal within the test
		t.Cleanup(func() { c.Close() })
		name := lockName(t)
		take, _ := k.lock(c, name)
		bg := context.Background()
		ctx, err := take(bg)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Client().Del(bg, name).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := take(ctx); !errors.Is(err, lock.ErrLost) {
			t.Fatalf("re-entry of a hold gone from Redis = %v; want ErrLost", err)
		}
		if ctx.Err() == nil {
			t.Fatal("the hold's context did not end when a re-entry found it gone")
		}
		if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLost) {
			t.Fatalf("the hold's context ended with %v; want a cause matching ErrLost", cause)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(lost) != 1 || !errors.Is(lost[0].Cause, lock.ErrLost) {
			t.Fatalf("the Observer was told %d EventLost %v; want one, with a cause matching ErrLost", len(lost), lost)
		}
	})
}

package lock_test

import (
	"context"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// HoldCount answers 0, not the cancelled lock context's error, once the
// final Unlock has ended the hold, for a Mutex, a FairMutex of the name and
// the Mutexes under a MultiLock.
func TestHoldCount_IsZeroAfterTheFinalUnlock(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	bg := context.Background()
	m := c.Mutex(name)
	ctx, err := m.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := m.HoldCount(ctx); n != 0 || err != nil {
		t.Fatalf("Mutex: HoldCount after the final Unlock = %d, %v; want 0, nil", n, err)
	}

	f := c.FairMutex(name + ":fair")
	ctx, err = f.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Mutex(name + ":fair").HoldCount(ctx); n != 1 || err != nil {
		t.Fatalf("FairMutex: HoldCount = %d, %v; want 1", n, err)
	}
	if err := f.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Mutex(name + ":fair").HoldCount(ctx); n != 0 || err != nil {
		t.Fatalf("FairMutex: HoldCount after the final Unlock = %d, %v; want 0, nil", n, err)
	}

	ml := c.MultiLock(name+":a", name+":b")
	ctx, err = ml.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{name + ":a", name + ":b"} {
		if n, err := c.Mutex(part).HoldCount(ctx); n != 0 || err != nil {
			t.Fatalf("MultiLock part %s: HoldCount after the final Unlock = %d, %v; want 0, nil", part, n, err)
		}
	}
}

// HoldCount answers 0 for a hold that was lost.
func TestHoldCount_IsZeroAfterALoss(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	ctx, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ForceUnlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock(ctx); err == nil { // the re-entry finds the hold gone: lost
		t.Fatal("re-entered a force-unlocked hold")
	}
	if n, err := m.HoldCount(ctx); n != 0 || err != nil {
		t.Fatalf("HoldCount after a loss = %d, %v; want 0, nil", n, err)
	}
}

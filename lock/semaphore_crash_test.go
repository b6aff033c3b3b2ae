package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// The permit of a holder that crashed comes back after its own lease while
// another holder of the semaphore stays alive and renewed: each permit
// expires on its own. (When every holder dies the key's expiry alone frees
// the permits; here the live holder's renewals keep the key.)
func TestSemaphore_ACrashedHoldersPermitReturnsWhileAnotherIsRenewed(t *testing.T) {
	srv := testenv.Redis(t)
	const lease = time.Second
	cs := instances(t, srv, 3, lock.WithWatchdogTimeout(lease))
	crashed, alive, next := cs[0], cs[1], cs[2]
	name := lockName(t)
	ctx := context.Background()
	if _, err := crashed.Semaphore(name, 2).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	kept, err := alive.Semaphore(name, 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Semaphore(name, 2).Release(kept)
	// The crash: the holder's process stops without releasing; nothing
	// renews its permit any more.
	crashed.Close()
	died := time.Now()

	got, err := next.Semaphore(name, 2).TryAcquire(ctx, 3*lease)
	if err != nil {
		t.Fatalf("the crashed holder's permit did not come back while another holder was renewed: %v", err)
	}
	defer next.Semaphore(name, 2).Release(got)
	if d := time.Since(died); d > 2*lease+500*time.Millisecond {
		t.Errorf("the permit came back %v after its holder crashed, want about its %v lease", d, lease)
	}
	// The live holder kept its permit all along: it still counts.
	if err := kept.Err(); err != nil {
		t.Fatalf("the live holder's permit ended: %v", context.Cause(kept))
	}
	if _, err := crashed.Semaphore(name, 2).TryAcquire(ctx, 0); err == nil {
		t.Fatal("a closed Client took a permit")
	}
	other := instances(t, srv, 1)[0]
	if _, err := other.Semaphore(name, 2).TryAcquire(ctx, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a third permit of two: %v, want ErrNotAcquired", err)
	}
}

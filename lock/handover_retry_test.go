package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/lock"
)

// A releaser whose handover ahead failed (its context ended with
// ErrReleased as the waiter was woken) and whose caller retries the Unlock
// while another waiter is queued hands the lock over again: its context's
// cause, readable by anyone since it ended, is not written again (under
// -race, a write there races with the reader below).
//
// The waiter may still be trying when the holder unlocks (a loaded
// machine): then nothing is handed over ahead, and the scenario is set up
// again, up to five times.
func TestHandover_ARetriedReleaseHandedOverAgainLeavesTheCauseAlone(t *testing.T) {
	var causes []error
	for range 5 {
		cause := retriedReleaseHandedOverAgain(t)
		if cause == nil {
			return
		}
		causes = append(causes, cause)
	}
	t.Fatalf("the lock was never handed over ahead in five tries (the releaser's causes: %v)", causes)
}

// retriedReleaseHandedOverAgain runs the scenario of
// TestHandover_ARetriedReleaseHandedOverAgainLeavesTheCauseAlone on a lock
// of its own. When the first Unlock did not hand the lock over ahead, it
// cleans up and returns the releaser's cause; otherwise nil.
func retriedReleaseHandedOverAgain(t *testing.T) error {
	refused := &refusedCalls{match: isTransfer, dial: true}
	stuck := &refusedCalls{match: isRelease, dial: true} // the retry in the background fails until the caller's own retry
	f := newFaultyHandover(t, refused, stuck)
	first := waiting(t, f.m)
	refused.left.Store(1)
	stuck.left.Store(1 << 20)
	defer stuck.left.Store(0)
	releaser := f.held
	if err := f.m.Unlock(releaser); err == nil {
		t.Fatal("the Unlock whose transfer was refused reported success")
	}
	refused.left.Store(0)
	if cause := context.Cause(releaser); !errors.Is(cause, lock.ErrReleased) {
		stuck.left.Store(0)
		f.m.Unlock(releaser) // retried until it gets through; its outcome is not this scenario's
		select {
		case ctx := <-first:
			if ctx != nil {
				f.m.Unlock(ctx)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the waiter did not get the lock after a release that was not handed over ahead (the releaser's context: %v)", cause)
		}
		return fmt.Errorf("the releaser's context: %w", cause)
	}
	stop := make(chan struct{})
	read := make(chan struct{})
	// reading: the cause was read once, so that a later write races with a
	// read.
	reading := make(chan struct{})
	go func() { // anyone that reads the releaser's cause meanwhile
		defer close(read)
		// The cause as a caller keeps it: read with no lock of the context,
		// so that a write of it while this loop runs is a data race that the
		// race detector reports whatever the interleaving.
		kept := context.Cause(releaser)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if cause := context.Cause(releaser); cause == nil || !errors.Is(cause, lock.ErrReleased) || cause.Error() == "" || kept.Error() == "" {
				t.Errorf("the releaser's cause changed: %v", cause)
				return
			}
			if n == 0 {
				close(reading)
			}
		}
	}()
	second := waiting(t, f.m)
	select {
	case <-reading:
	case <-read:
	}
	err := f.m.Unlock(releaser) // hands the lock over to a waiter again
	close(stop)
	<-read
	stuck.left.Store(0)
	if err != nil {
		t.Fatalf("the caller's retry of the Unlock: %v", err)
	}
	got := make(chan context.Context, 2)
	for _, next := range []<-chan context.Context{first, second} {
		go func() { got <- <-next }()
	}
	for range 2 {
		select {
		case ctx := <-got:
			if ctx != nil && ctx.Err() == nil {
				if err := f.m.Unlock(ctx); err != nil {
					t.Fatalf("a waiter's Unlock: %v", err)
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter did not get the lock")
		}
	}
	f.isFree(t)
	return nil
}

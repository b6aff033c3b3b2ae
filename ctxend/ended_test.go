package ctxend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
)

func TestEnded(t *testing.T) {
	if ctxend.Ended(context.Background()) {
		t.Fatal("a background context ended")
	}
	live, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if ctxend.Ended(live) {
		t.Fatal("a context an hour from its deadline ended")
	}
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if !ctxend.Ended(cancelled) || !errors.Is(cancelled.Err(), context.Canceled) {
		t.Fatal("a cancelled context did not end")
	}
}

// Right after its deadline a context has ended, and says why when Ended
// returns, whether or not its timer has fired yet.
func TestEnded_PassedDeadlineSaysDeadlineExceeded(t *testing.T) {
	for i := 0; i < 1000; i++ {
		d := time.Now().Add(time.Duration(i%5) * time.Microsecond)
		ctx, cancel := context.WithDeadline(context.Background(), d)
		for time.Now().Before(d) {
		}
		if !ctxend.Ended(ctx) {
			t.Fatalf("try %d: not ended after its deadline", i)
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("try %d: Err = %v after Ended, want DeadlineExceeded", i, ctx.Err())
		}
		cancel()
	}
}

// neverDone reports a deadline but can never be cancelled (its Done is nil):
// a context out of contract, which must not hang Ended.
type neverDone struct{ context.Context }

func (neverDone) Deadline() (time.Time, bool) { return time.Now().Add(-time.Second), true }

func TestEnded_NilDoneNeverEnds(t *testing.T) {
	if ctxend.Ended(neverDone{context.Background()}) {
		t.Fatal("a context that cannot be cancelled ended")
	}
}

// A context derived from one that reports a deadline it never enforces has
// a Done channel but no timer: Ended gives up waiting and says it has not
// ended, as the context itself does.
func TestEnded_UnenforcedDeadlineDoesNotHang(t *testing.T) {
	ctx, cancel := context.WithCancelCause(neverDone{context.Background()})
	defer cancel(nil)
	start := time.Now()
	if ctxend.Ended(ctx) {
		t.Fatal("a context nobody cancels ended")
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("Ended waited %v", waited)
	}
}

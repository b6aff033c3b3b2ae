package reliability

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// pauseWatchdog is the watchdog timeout of the pause scenarios: a holder
// frozen for longer loses its lock.
const pauseWatchdog = 600 * time.Millisecond

// pauseRun is what one run of the holder-pause scenario produced.
type pauseRun struct {
	report   history.Report
	late     faults.HolderEvent // the frozen holder's write after it woke
	lost     faults.HolderEvent // its loss notice
	unlocked faults.HolderEvent
	newer    int64 // the token of the holder that took over
	noticeIn time.Duration
}

// pauseHolder runs the holder pause (a stop-the-world GC or a frozen VM
// outlasting the lease): holder process a takes the lock and reads the
// register, then is frozen with SIGSTOP; its lease runs out; b, in this
// process, takes the lock, reads, writes and releases; a is told to write
// and resumed. It returns the checked history.
func pauseHolder(t *testing.T, o faults.HolderOptions) pauseRun {
	t.Helper()
	o.Watchdog = pauseWatchdog
	bin := binary(t, faults.HolderPackage)
	srv := testenv.Redis(t)
	const key = "sku:pause"
	db, dsn := registers(t, key)
	rec := history.NewRecorder()

	a := faults.StartHolder(t, bin, "a", srv.Addr, dsn, o)
	locked := a.Lock(key, 10*time.Second)
	a.Read(key)
	a.Stop()
	frozen := time.Now()

	// b waits for the lock: it gets it once a's lease has run out.
	b := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(pauseWatchdog))
	m := b.Mutex(key)
	ctx, err := m.TryLock(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatalf("b did not get the lock of the frozen holder: %v", err)
	}
	if waited := time.Since(frozen); waited > pauseWatchdog+2*time.Second {
		t.Errorf("b waited %v for a lease of %v", waited, pauseWatchdog)
	}
	s := enter(rec, "b", key, ctx)
	if s.Token() <= locked.Token {
		t.Fatalf("b's token %d is not newer than the frozen holder's %d", s.Token(), locked.Token)
	}
	if err := s.Read(db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(db, true); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	s.Leave()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// a wakes with its write already queued, as a thread resuming after a
	// pause carries on where it stopped.
	from := a.Len()
	a.Send("write %s", key)
	woke := history.Now()
	a.Cont()
	line, _ := a.AwaitFrom(from, 10*time.Second, "the late write", func(l []byte) bool {
		return faults.Event[faults.HolderEvent](t, l).Ev == "write"
	})
	run := pauseRun{late: faults.Event[faults.HolderEvent](t, line), newer: s.Token()}
	run.lost = a.AwaitLost(key, 5*time.Second)
	run.noticeIn = time.Unix(0, run.lost.At).Sub(woke)
	run.unlocked = a.Unlock(key)
	a.Send("exit")
	a.Wait(10 * time.Second)

	a.Record(rec)
	run.report = check(t, rec, db)
	t.Logf("a held token %d, b %d; a told of its loss %v after waking; %s", locked.Token, s.Token(), run.noticeIn, run.report)
	return run
}

// A holder paused past its lease, with the whole framework: the frozen holder's late
// write is refused, its context says the lock was lost, and the history is
// clean. Which refuses the write depends on a race after SIGCONT: the
// watchdog may cancel the context first (the plugin refuses before sending)
// or the write may reach the database first (the fence refuses it).
//
// When the cancellation lands while the write is on its way, the driver
// aborts the statement and the write can fail with the driver's error
// ("context canceled; invalid connection") instead of fencing.ErrStale;
// either way nothing is applied, which the history's final state shows.
func TestPause_HolderFrozenPastItsLeaseIsFencedOff(t *testing.T) {
	run := pauseHolder(t, faults.HolderOptions{})
	wantPauseFenced(t, run, false)
	how := "by the database's fence"
	switch {
	case !run.late.Stale:
		how = "by the driver, the context cancelled on its way: " + run.late.Err
	case run.late.Current == 0:
		how = "before it was sent: the context was already cancelled"
	}
	t.Logf("the late write was refused %s", how)
}

// The same pause when the loss notice reaches the holder only after its
// write has gone out, the case the watchdog cannot help with: the database
// refuses the write because a newer token wrote the row.
func TestPause_WriteSentBeforeTheLossNoticeIsRefusedByTheFence(t *testing.T) {
	run := pauseHolder(t, faults.HolderOptions{LateNotice: true})
	wantPauseFenced(t, run, true)
	if run.late.Current != run.newer {
		t.Fatalf("late write %+v: want it refused by the fence naming the newer token %d", run.late, run.newer)
	}
}

func wantPauseFenced(t *testing.T, run pauseRun, stale bool) {
	t.Helper()
	if run.late.Accepted || stale && !run.late.Stale {
		t.Fatalf("the frozen holder's late write: %+v, want refused as stale", run.late)
	}
	// The cause crossed a process boundary as text: lock "<name>": lost: …
	lost := ": " + strings.TrimPrefix(lock.ErrLost.Error(), "lock: ") + ":"
	if !strings.Contains(run.lost.Cause, lost) {
		t.Fatalf("loss notice %+v, want a cause naming %q", run.lost, lost)
	}
	if run.noticeIn > pauseWatchdog/3+time.Second {
		t.Errorf("the holder learned of its loss %v after waking; its watchdog renews every %v", run.noticeIn, pauseWatchdog/3)
	}
	if !run.unlocked.Lost {
		t.Errorf("unlock after the loss: %+v, want lock.ErrLost", run.unlocked)
	}
	if !run.report.OK() {
		t.Fatalf("history: %s", run.report)
	}
	if s := run.report.Summary; s.Holds != 2 || s.Accepted != 1 || s.Rejected != 1 {
		t.Fatalf("history: %s", run.report)
	}
}

// Without the fence (a model that never declared the fence column) the same
// pause oversells: the frozen holder's write lands on top of the newer
// holder's, and the checker reports it. A green run of the suite means
// something only because this one is red in the checker.
func TestPause_WithoutTheFenceTheCheckerFindsTheLostUpdate(t *testing.T) {
	run := pauseHolder(t, faults.HolderOptions{LateNotice: true, NoFence: true})
	if !run.late.Accepted {
		t.Fatalf("unfenced late write %+v, want it accepted", run.late)
	}
	for _, k := range []history.Kind{history.OvertakenWrite, history.LostUpdate, history.NotLinearizable} {
		if !run.report.Has(k) {
			t.Errorf("the checker missed the %s of an unfenced pause:\n%s", k, run.report)
		}
	}
}

// The in-process form of the pause, without a second process: a holder
// whose context lost its cancellation (context.WithoutCancel) is a holder
// that never hears of its loss. Its write is refused all the same, and the
// error names both tokens.
func TestPause_HolderThatNeverHearsOfItsLossCannotWrite(t *testing.T) {
	srv := testenv.Redis(t)
	const key = "sku:deaf"
	db, _ := registers(t, key)
	a := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(pauseWatchdog))
	b := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(pauseWatchdog))
	actx, err := a.Mutex(key).Lock(context.Background(), lock.WithLease(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	deaf := context.WithoutCancel(actx)
	bctx, err := b.Mutex(key).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := faults.WriteRegister(bctx, db, key, 1, true); err != nil {
		t.Fatal(err)
	}
	err = faults.WriteRegister(deaf, db, key, 1, true)
	var se *fencing.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("write of the holder that never heard: %v, want a *fencing.StaleError", err)
	}
	atok, _ := fencing.FromContext(actx)
	btok, _ := fencing.FromContext(bctx)
	if se.Token != atok || se.Current != btok {
		t.Fatalf("stale error names tokens %d and %d, want %d and %d", se.Token, se.Current, atok, btok)
	}
	if !errors.Is(context.Cause(actx), lock.ErrLost) {
		t.Fatalf("the lease ran out but the lock context says %v", context.Cause(actx))
	}
}

package reliability

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// partitioned runs a holder cut off from Redis (its proxy blackholes every
// packet) while a second Client, still connected, waits for the lock. It
// returns both sections once the cut-off holder has been told of its loss,
// and when, measured from the cut, b got in and a was told.
func partitioned(t *testing.T, key string) (a, b *section, bIn, aTold time.Duration) {
	t.Helper()
	const watchdog = time.Second
	srv := testenv.Redis(t)
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rec := history.NewRecorder()
	ac := lockClient(t, p.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	bc := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	actx, err := ac.Mutex(key).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a = enter(rec, "a", key, actx)
	time.Sleep(watchdog / 2) // a renewal or so has gone through
	p.SetBlackhole(true)
	t.Cleanup(func() { p.SetBlackhole(false) })
	cut := history.Now()
	bctx, err := bc.Mutex(key).TryLock(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatalf("b never got the lock of the cut-off holder: %v", err)
	}
	bIn = history.Now().Sub(cut)
	b = enter(rec, "b", key, bctx)
	select {
	case <-actx.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the cut-off holder was never told it lost its lock")
	}
	if cause := context.Cause(actx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the cut-off holder's context ended with %v, want lock.ErrLost", cause)
	}
	eventually(t, time.Second, "the loss recorded", func() bool { return a.lostAt.Load() != 0 })
	aTold = time.Unix(0, a.lostAt.Load()).Sub(cut)
	t.Logf("cut at 0: b got the lock after %v, a was told after %v", bIn.Round(time.Millisecond), aTold.Round(time.Millisecond))
	return a, b, bIn, aTold
}

// A holder cut off from Redis while its lock vanishes on the server (a
// restart without persistence: a failover or an eviction does the same)
// cannot learn of its loss before its own lease ends: the newer holder gets
// in at once and writes, and the cut-off holder's write, sent before the
// notice can arrive — the recorded write ends before the context is
// cancelled — is refused by the fence. Once told, its next write is refused
// before it is sent.
func TestPartition_CutOffHolderIsToldAndFencedOff(t *testing.T) {
	const (
		key      = "sku:partition"
		watchdog = 3 * time.Second // renewed every second: the cut leaves a lease of 2 s or so
	)
	db, _ := registers(t, key)
	srv := testenv.Redis(t)
	p, err := faults.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rec := history.NewRecorder()
	ac := lockClient(t, p.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	bc := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	actx, err := ac.Mutex(key).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	a := enter(rec, "a", key, actx)
	if err := a.Read(db); err != nil {
		t.Fatal(err)
	}
	p.SetBlackhole(true)
	t.Cleanup(func() { p.SetBlackhole(false) })
	srv.Restart()
	cut := history.Now()

	bctx, err := bc.Mutex(key).TryLock(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatalf("b after the restart: %v", err)
	}
	b := enter(rec, "b", key, bctx)
	if b.Token() <= a.Token() {
		t.Fatalf("b's token %d is not above the cut-off holder's %d", b.Token(), a.Token())
	}
	if err := b.Read(db); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(db, true); err != nil {
		t.Fatalf("the newer holder's write: %v", err)
	}
	// a, not told yet (its renewals are held in the network), writes.
	early, err := a.Write(db, true)
	if early.Accepted || !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("the cut-off holder's write sent before its notice: %v (accepted %v), want refused by the fence", err, early.Accepted)
	}
	var se *fencing.StaleError
	if !errors.As(err, &se) || se.Current != fencing.Token(b.Token()) {
		t.Fatalf("the cut-off holder's early write: %v, want refused by the fence naming the newer token %d", err, b.Token())
	}

	select {
	case <-actx.Done():
	case <-time.After(2 * watchdog):
		t.Fatal("the cut-off holder was never told it lost its lock")
	}
	if cause := context.Cause(actx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the cut-off holder's context ended with %v, want lock.ErrLost", cause)
	}
	eventually(t, time.Second, "the loss recorded", func() bool { return a.lostAt.Load() != 0 })
	told := time.Unix(0, a.lostAt.Load())
	if !early.End.Before(told) {
		t.Fatalf("the early write ended at %v after the cut, the notice came at %v: it was not sent before the notice",
			early.End.Sub(cut), told.Sub(cut))
	}
	// Told now: its read is refused, and so is the write it attempts
	// anyway, before it is sent.
	if err := a.Read(db); err == nil {
		t.Fatal("a read under a lock context that says lost succeeded")
	}
	if w, err := a.Write(db, true); w.Accepted || !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("the cut-off holder's write after its notice: %v, want refused as stale", err)
	}
	a.Leave()
	b.Leave()
	r := check(t, rec, db, history.NoticeWithin(watchdog))
	t.Logf("cut and restarted at 0: b got in after %v; a's write refused by the fence (row fenced by token %d) at %v; a told at %v; %s",
		b.hold.Enter.Sub(cut).Round(time.Millisecond), se.Current,
		early.End.Sub(cut).Round(time.Millisecond), told.Sub(cut).Round(time.Millisecond), r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
}

// A holder cut off from Redis is told of its loss before the server lets
// anyone else in: its watchdog knows when the lease it last renewed runs out
// (measured from before the renewal was sent) and cancels the context then,
// whatever its Redis call is still waiting for.
func TestPartition_CutOffHolderIsToldBeforeAnotherGetsIn(t *testing.T) {
	_, _, bIn, aTold := partitioned(t, "sku:told-first")
	if aTold > bIn {
		t.Fatalf("b got the lock %v after the cut; a was told only %v after it, so for %v a's context said it held a lock b held",
			bIn, aTold, aTold-bIn)
	}
}

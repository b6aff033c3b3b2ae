package reliability

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// window runs the gap that fencing writes alone leaves: a holds the lock
// and reads the register; its lease runs out and a is not told
// (context.WithoutCancel stands in for a holder paused, or cut off from
// Redis, at that moment); b takes the lock, optionally claims the row
// (gormplugin.Claim), and reads; then a writes, then b writes. It returns
// the checked history and a's write.
func window(t *testing.T, claim bool) (history.Report, history.Write) {
	t.Helper()
	srv := testenv.Redis(t)
	const key = "sku:window"
	db, _ := registers(t, key)
	rec := history.NewRecorder()
	ac := lockClient(t, srv.Addr, nil)
	bc := lockClient(t, srv.Addr, nil)

	actx, err := ac.Mutex(key).Lock(context.Background(), lock.WithLease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	a := enter(rec, "a", key, context.WithoutCancel(actx)) // a will not hear of its loss in time
	if err := a.Read(db); err != nil {
		t.Fatal(err)
	}
	bctx, err := bc.Mutex(key).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b := enter(rec, "b", key, bctx)
	if claim {
		if err := gormplugin.Claim(db.WithContext(bctx), &faults.Register{Name: key}); err != nil {
			t.Fatalf("b's claim: %v", err)
		}
	}
	if err := b.Read(db); err != nil {
		t.Fatal(err)
	}
	aw, _ := a.Write(db, true)
	if _, err := b.Write(db, true); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	b.Leave()
	a.Leave()
	if err := bc.Mutex(key).Unlock(bctx); err != nil {
		t.Fatal(err)
	}
	r := check(t, rec, db)
	t.Logf("a's write: accepted %v %s; %s", aw.Accepted, aw.Err, r)
	return r, aw
}

// The limit of fencing: a write is refused only once a newer token has
// written the row. A newer holder that has read but not yet written cannot
// stop an older holder, not yet told of its loss, from writing in between;
// the newer holder then overwrites a value it never saw. The checker
// reports the overlap and the lost update.
func TestWindow_FenceAloneLetsAnOlderWriteInBeforeTheNewerHolderWrites(t *testing.T) {
	r, aw := window(t, false)
	if !aw.Accepted {
		t.Fatalf("the older holder's write was refused (%s): the window did not open", aw.Err)
	}
	for _, k := range []history.Kind{history.Overlap, history.LostUpdate, history.NotLinearizable} {
		if !r.Has(k) {
			t.Errorf("the checker missed the %s:\n%s", k, r)
		}
	}
}

// Claiming the row first (gormplugin.Claim: the row's fence raised to the
// newer token before the read) closes the window: the older holder's write is refused, and
// apart from the overlap of the two holds, which is the premise, the
// history is clean.
func TestWindow_ClaimingTheRowBeforeReadingClosesIt(t *testing.T) {
	r, aw := window(t, true)
	if aw.Accepted || !strings.Contains(aw.Err, fencing.ErrStale.Error()) {
		t.Fatalf("the older holder's write after the claim: accepted %v (%s), want refused as stale", aw.Accepted, aw.Err)
	}
	for _, a := range r.Anomalies {
		if a.Kind != history.Overlap {
			t.Errorf("%s", a)
		}
	}
	if !r.Has(history.Overlap) {
		t.Errorf("the overlap of the two holds was not reported:\n%s", r)
	}
}

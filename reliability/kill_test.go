package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A holder process killed with SIGKILL after its write committed and before
// its Unlock: nothing renews its lock, which comes back within one lease
// (the watchdog timeout from the last renewal), never before Redis expires
// it; the next holder reads the committed write and adds its own, so the
// register counts both once — no write is lost or repeated — and the
// history is clean. The dead process's hold is recorded as ending when it
// was killed.
func TestKill_HolderKilledBetweenCommitAndUnlock(t *testing.T) {
	const (
		key      = "sku:kill"
		watchdog = 900 * time.Millisecond
	)
	bin := binary(t, faults.HolderPackage)
	srv := testenv.Redis(t)
	db, dsn := registers(t, key)
	rec := history.NewRecorder()

	a := faults.StartHolder(t, bin, "a", srv.Addr, dsn, faults.HolderOptions{Watchdog: watchdog})
	locked := a.Lock(key, 10*time.Second)
	a.Read(key)
	w := a.Write(key)
	if !w.Accepted {
		t.Fatalf("the holder's write: %+v", w)
	}
	a.Kill()
	killed := history.Now()
	ttl := time.Duration(srv.Do("PTTL", key).(int64)) * time.Millisecond
	if ttl <= 0 {
		t.Fatalf("the killed holder's lock has PTTL %v: it was released, not left behind", ttl)
	}
	rec.AddHold(history.Hold{Key: key, Owner: "a", Token: locked.Token, Enter: time.Unix(0, locked.At), Leave: killed})
	rec.AddWrite(history.Write{Key: key, Owner: "a", Token: w.Token, Read: w.Read, ReadAt: time.Unix(0, w.ReadAt),
		Value: w.Value, Start: time.Unix(0, w.Start), End: time.Unix(0, w.End), Accepted: true})

	b := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	ctx, err := b.Mutex(key).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatalf("the lock of the killed holder did not come back: %v", err)
	}
	waited := history.Now().Sub(killed)
	s := enter(rec, "b", key, ctx)
	if waited > watchdog+300*time.Millisecond || waited < ttl-50*time.Millisecond {
		t.Errorf("the next holder got the lock %v after the kill; its key had %v to live, the lease is %v", waited, ttl, watchdog)
	}
	if s.Token() <= locked.Token {
		t.Errorf("the next holder's token %d is not above the killed holder's %d", s.Token(), locked.Token)
	}
	if err := s.Read(db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(db, true); err != nil {
		t.Fatalf("the next holder's write: %v", err)
	}
	s.Leave()
	_ = b.Mutex(key).Unlock(ctx)
	r := check(t, rec, db)
	t.Logf("killed with %v left on its lease; the next holder got in %v later; %s", ttl, waited.Round(time.Millisecond), r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
	if v := finalValues(t, db)[key]; v != 2 {
		t.Fatalf("register %d, want 2: the committed write and the next holder's, once each", v)
	}
}

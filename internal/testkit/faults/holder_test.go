package faults

import (
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

func TestHolder_StopFreezesItUntilCont(t *testing.T) {
	bin := Build(t, HolderPackage)
	srv := testenv.Redis(t)
	dsn := testenv.MySQL(t)
	db, err := OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := SeedRegisters(db, "r"); err != nil {
		t.Fatal(err)
	}
	h := StartHolder(t, bin, "h", srv.Addr, dsn, HolderOptions{})

	h.Stop()
	from := h.Len()
	h.Send("lock r")
	time.Sleep(300 * time.Millisecond)
	if n := h.Len(); n != from {
		t.Fatalf("a stopped holder wrote %q", h.Lines()[from:])
	}
	if got := srv.Do("EXISTS", "r"); got != int64(0) {
		t.Fatal("a stopped holder took the lock")
	}
	h.Cont()
	locked := Event[HolderEvent](t, h.Await(10*time.Second, "locked r", func(l []byte) bool { return Event[HolderEvent](t, l).Ev == "locked" }))
	if locked.Token <= 0 {
		t.Fatalf("locked without a token: %+v", locked)
	}
	if e := h.Read("r"); e.Value != 0 {
		t.Fatalf("read %+v", e)
	}
	if e := h.Write("r"); !e.Accepted || e.Value != 1 || e.Read != 0 {
		t.Fatalf("write %+v", e)
	}
	if e := h.Unlock("r"); e.Err != "" {
		t.Fatalf("unlock %+v", e)
	}
	h.Send("exit")
	h.Wait(10 * time.Second)

	rec := history.NewRecorder()
	h.Record(rec)
	final, err := RegisterValues(db)
	if err != nil {
		t.Fatal(err)
	}
	r := history.Check(rec.History(), final)
	if !r.OK() || r.Summary.Holds != 1 || r.Summary.Accepted != 1 {
		t.Fatalf("history of one clean hold: %s", r)
	}
}

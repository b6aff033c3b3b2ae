package reliability

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// quiet discards the log lines the faults provoke.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// registers returns a fresh database holding a register of value 0 per
// name, and its DSN.
func registers(t testing.TB, names ...string) (*gorm.DB, string) {
	t.Helper()
	dsn := testenv.MySQL(t)
	db, err := faults.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	if err := faults.SeedRegisters(db, names...); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}

// openPlain opens the database dsn with gormplugin, for checks that read.
func openPlain(t testing.TB, dsn string) *gorm.DB {
	t.Helper()
	db, err := faults.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	return db
}

// closeDB closes db's connections.
func closeDB(t testing.TB, db *gorm.DB) {
	t.Helper()
	sqlDB, err := db.DB()
	if err == nil {
		err = sqlDB.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// finalValues reads every register.
// check runs the history checker on rec against the registers' final values
// and fences (so that a refused write the database applied is caught).
func check(t testing.TB, rec *history.Recorder, db *gorm.DB, opts ...history.Option) history.Report {
	t.Helper()
	fences, err := faults.RegisterFences(db)
	if err != nil {
		t.Fatal(err)
	}
	return history.Check(rec.History(), finalValues(t, db), append([]history.Option{history.Fences(fences)}, opts...)...)
}

func finalValues(t testing.TB, db *gorm.DB) map[string]int64 {
	t.Helper()
	v, err := faults.RegisterValues(db)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lockClient returns a lock Client with a go-redis client of its own on
// addr, as one process of a service would have; both close when t ends.
func lockClient(t testing.TB, addr string, ro func(*redis.Options), opts ...lock.Option) *lock.Client {
	t.Helper()
	o := &redis.Options{Addr: addr}
	if ro != nil {
		ro(o)
	}
	rdb := redis.NewClient(o)
	c := lock.New(rdb, append([]lock.Option{lock.WithLogger(quiet)}, opts...)...)
	t.Cleanup(func() {
		c.Close()
		rdb.Close()
	})
	return c
}

// A section is one critical section run in this process, recorded as it
// goes: its hold, its read and its write of the register named like the lock.
type section struct {
	rec    *history.Recorder
	hold   history.Hold
	ctx    context.Context
	lostAt atomic.Int64 // UnixNano when ctx was cancelled with lock.ErrLost
	stop   func() bool

	read   int64
	readAt time.Time
}

// enter records the start of a critical section under the context ctx that
// Lock returned.
func enter(rec *history.Recorder, owner, key string, ctx context.Context) *section {
	tok, _ := fencing.FromContext(ctx)
	s := &section{rec: rec, ctx: ctx, hold: history.Hold{Key: key, Owner: owner, Token: int64(tok), Enter: history.Now()}}
	s.stop = context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), lock.ErrLost) {
			s.lostAt.Store(history.Now().UnixNano())
		}
	})
	return s
}

// Token returns the hold's fencing token.
func (s *section) Token() int64 { return s.hold.Token }

// Read reads the register under the lock.
func (s *section) Read(db *gorm.DB) error {
	start := history.Now()
	v, err := faults.ReadRegister(s.ctx, db, s.hold.Key)
	if err != nil {
		return err
	}
	s.read, s.readAt = v, start
	return nil
}

// Write writes back the value read plus one, fenced unless fenced is false,
// and records the outcome.
func (s *section) Write(db *gorm.DB, fenced bool) (history.Write, error) {
	w := history.Write{Key: s.hold.Key, Owner: s.hold.Owner, Token: s.hold.Token,
		Read: s.read, ReadAt: s.readAt, Value: s.read + 1, Start: history.Now()}
	err := faults.WriteRegister(s.ctx, db, s.hold.Key, w.Value, fenced)
	w.End = history.Now()
	w.Accepted = err == nil
	if err != nil {
		w.Err = err.Error()
	}
	s.rec.AddWrite(w)
	return w, err
}

// Leave records the end of the critical section; call it before Unlock.
func (s *section) Leave() history.Hold {
	s.hold.Leave = history.Now()
	s.stop()
	if ns := s.lostAt.Load(); ns != 0 {
		s.hold.LostAt = time.Unix(0, ns)
	}
	if errors.Is(context.Cause(s.ctx), lock.ErrLost) && (s.hold.LostAt.IsZero() || s.hold.LostAt.After(s.hold.Leave)) {
		s.hold.LostAt = s.hold.Leave // it knew by then
	}
	s.rec.AddHold(s.hold)
	return s.hold
}

// eventually polls cond every 5ms until it holds, and fails t after d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

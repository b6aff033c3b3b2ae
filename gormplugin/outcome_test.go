package gormplugin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/gorm"
)

// "Refused" means "not applied": a write the database may have applied is
// never reported as stale. These tests check the row after the fact, not only
// the error.

// blockRow starts a transaction on db that holds the product's row lock
// (SELECT ... FOR UPDATE) until the returned function ends it.
func blockRow(t *testing.T, db *gorm.DB, id uint) (release func()) {
	t.Helper()
	tx := db.Begin()
	if tx.Error != nil {
		t.Fatal(tx.Error)
	}
	var p Product
	if err := tx.Raw("SELECT * FROM products WHERE id = ? FOR UPDATE", id).Scan(&p).Error; err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			tx.Rollback()
		}
	}
	t.Cleanup(release)
	return release
}

// waitForStatement polls the server's process list until a statement of
// this test's database whose text starts with prefix is running (in a state
// such as waiting for a row lock), or until it is gone when gone is set.
func waitForStatement(t *testing.T, db *gorm.DB, prefix string, gone bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		err := db.Raw("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE ? AND ID <> CONNECTION_ID()", prefix+"%").Scan(&n).Error
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) != gone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("statement %q still %s after 10s", prefix, map[bool]string{true: "running", false: "not running"}[gone])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A write outside any transaction that waits for a row lock while its lock
// context ends is abandoned by the driver, but the server runs it once the
// row lock is free: its outcome is unknown, and the row shows it applied.
func TestOutcome_AutocommitWriteBlockedPastItsContextIsNotRefused(t *testing.T) {
	t.Parallel()
	writes := map[string]func(db *gorm.DB, ctx context.Context, id uint) error{
		"fenced update, no default transaction": func(db *gorm.DB, ctx context.Context, id uint) error {
			return db.Session(&gorm.Session{SkipDefaultTransaction: true}).WithContext(ctx).
				Model(&Product{ID: id}).Update("stock", 9).Error
		},
		"raw exec": func(db *gorm.DB, ctx context.Context, id uint) error {
			return db.WithContext(ctx).Exec("UPDATE products SET stock = 9, fence = 7 WHERE id = ? AND fence <= 7", id).Error
		},
	}
	for name, write := range writes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, _ := open(t)
			// Whether the server runs the abandoned statement depends on
			// whether it notices the closed connection before the row lock
			// is free; either way the answer must be "outcome unknown". The
			// test needs one round where it ran to show that such a write is
			// never reported refused.
			const rounds = 8
			for round := 1; ; round++ {
				p := seed(t, db, fmt.Sprintf("sku-%d", round), 10, 0)
				release := blockRow(t, db, p.ID)

				ctx, cancel := context.WithCancelCause(at(7))
				errc := make(chan error, 1)
				go func() { errc <- write(db, ctx, p.ID) }()
				waitForStatement(t, db, "UPDATE", false)
				cancel(errLost) // the lock is lost while the write waits for the row
				err := <-errc
				release()
				waitForStatement(t, db, "UPDATE", true)

				got := load(t, db, p.ID)
				applied := got.Stock == 9 && got.Fence.Token() == 7
				t.Logf("round %d: err = %v; row: stock %d fence %d", round, err, got.Stock, got.Fence)
				if errors.Is(err, fencing.ErrStale) {
					t.Fatalf("err = %v: reported refused, but the write may have been applied (applied: %v)", err, applied)
				}
				if !errors.Is(err, gormplugin.ErrOutcomeUnknown) || !errors.Is(err, errLost) {
					t.Fatalf("err = %v, want gormplugin.ErrOutcomeUnknown with the lock's cause", err)
				}
				if applied {
					break
				}
				if round == rounds {
					t.Fatalf("in %d rounds the server never applied the abandoned write, so this test shows nothing", rounds)
				}
			}
		})
	}
}

// The same wait inside GORM's default transaction: the server runs the
// statement once the row lock is free, but the transaction is never
// committed, so the write is refused, and the row shows nothing.
func TestOutcome_TransactionalWriteBlockedPastItsContextIsRefused(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 0)
	release := blockRow(t, db, p.ID)

	ctx, cancel := context.WithCancelCause(at(7))
	defer cancel(nil)
	errc := make(chan error, 1)
	go func() { errc <- db.WithContext(ctx).Model(&Product{ID: p.ID}).Update("stock", 9).Error }()
	waitForStatement(t, db, "UPDATE", false)
	cancel(errLost)
	err := <-errc
	release()
	waitForStatement(t, db, "UPDATE", true)

	wantRow(t, db, p.ID, 10, 0)
	if !errors.Is(err, fencing.ErrStale) || !errors.Is(err, errLost) {
		t.Fatalf("err = %v, want fencing.ErrStale with the lock's cause", err)
	}
}

// proxiedDB opens the test database through a faults.Proxy in front of the
// MariaDB server.
func proxiedDB(t *testing.T) (*gorm.DB, *gorm.DB, *faults.Proxy) {
	t.Helper()
	dsn := testenv.MySQL(t)
	direct, _ := openWith(t, dsn, gormplugin.New(), &gorm.Config{})
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.NewProxy(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg.Addr = proxy.Addr
	via, _ := openWith(t, cfg.FormatDSN(), gormplugin.New(), &gorm.Config{})
	if sqlDB, err := via.DB(); err == nil {
		sqlDB.SetMaxIdleConns(0) // each write on a fresh connection through the proxy
	}
	return direct, via, proxy
}

// commitQuery is the start of a COM_QUERY packet's payload for COMMIT.
var commitQuery = []byte("\x03COMMIT")

// A COMMIT that reaches the server and commits, whose answer is lost on the
// way back (the connection reset between its arrival and its reply): the
// write was applied, and the error says the outcome is unknown — whether or
// not the lock's context ended meanwhile — never that it was refused.
func TestOutcome_CommitWhoseReplyIsLostIsNotRefused(t *testing.T) {
	t.Parallel()
	for _, loseLock := range []bool{true, false} {
		t.Run(fmt.Sprintf("lock lost meanwhile=%v", loseLock), func(t *testing.T) {
			t.Parallel()
			direct, via, proxy := proxiedDB(t)
			p := seed(t, direct, "sku-1", 10, 0)

			ctx, cancel := context.WithCancelCause(at(7))
			defer cancel(nil)
			lost := proxy.LoseReplyTo(faults.Containing(commitQuery), func() {
				if loseLock {
					cancel(errLost)
				}
			})
			err := via.WithContext(ctx).Model(&Product{ID: p.ID}).Update("stock", 9).Error
			select {
			case <-lost:
			default:
				t.Fatalf("err = %v, and the COMMIT's reply was not lost: the fault did not fire", err)
			}
			wantRow(t, direct, p.ID, 9, 7)
			if errors.Is(err, fencing.ErrStale) {
				t.Fatalf("err = %v: reported refused, but the row shows the write committed", err)
			}
			if !errors.Is(err, gormplugin.ErrOutcomeUnknown) {
				t.Fatalf("err = %v, want gormplugin.ErrOutcomeUnknown", err)
			}
			if !errors.Is(err, gomysql.ErrInvalidConn) {
				t.Errorf("err = %v, want the driver's error kept", err)
			}
			if loseLock && !errors.Is(err, errLost) {
				t.Errorf("err = %v, want the lock's cause kept", err)
			}
		})
	}
}

// The caller's own transaction, committed by gormplugin.Transaction: a lost
// COMMIT reply is an unknown outcome too, and the transaction's statements
// and a commit refused because the context ended are reported as before.
func TestOutcome_TransactionHelperReportsTheCommit(t *testing.T) {
	t.Parallel()
	direct, via, proxy := proxiedDB(t)
	p := seed(t, direct, "sku-1", 10, 0)
	buy := func(ctx context.Context, stock int) error {
		return gormplugin.Transaction(via.WithContext(ctx), func(tx *gorm.DB) error {
			if err := tx.Create(&Ledger{Note: fmt.Sprint("stock ", stock)}).Error; err != nil {
				return err
			}
			return tx.Model(&Product{ID: p.ID}).Update("stock", stock).Error
		})
	}

	// Lost reply: committed, outcome unknown.
	ctx, cancel := context.WithCancelCause(at(7))
	defer cancel(nil)
	lost := proxy.LoseReplyTo(faults.Containing(commitQuery), func() { cancel(errLost) })
	err := buy(ctx, 9)
	<-lost
	wantRow(t, direct, p.ID, 9, 7)
	if errors.Is(err, fencing.ErrStale) || !errors.Is(err, gormplugin.ErrOutcomeUnknown) || !errors.Is(err, errLost) {
		t.Fatalf("lost commit reply: err = %v, want gormplugin.ErrOutcomeUnknown with the lock's cause", err)
	}

	// A newer token wrote: the statement is refused, nothing committed.
	if err := buy(at(5), 8); !errors.Is(err, fencing.ErrStale) || errors.Is(err, gormplugin.ErrOutcomeUnknown) {
		t.Fatalf("older token: err = %v, want stale only", err)
	}
	// Success.
	if err := buy(at(8), 8); err != nil {
		t.Fatalf("newer token: %v", err)
	}
	wantRow(t, direct, p.ID, 8, 8)
	var n int64
	direct.Model(&Ledger{}).Count(&n)
	if n != 2 {
		t.Errorf("%d ledger rows, want 2 (the committed transactions')", n)
	}
	// A context that ended before the commit: database/sql does not send it.
	ctx2, cancel2 := context.WithCancelCause(at(9))
	err = gormplugin.Transaction(via.WithContext(ctx2), func(tx *gorm.DB) error {
		if err := tx.Model(&Product{ID: p.ID}).Update("stock", 1).Error; err != nil {
			return err
		}
		cancel2(errLost)
		return nil
	})
	if !errors.Is(err, fencing.ErrStale) || !errors.Is(err, errLost) {
		t.Fatalf("context ended before the commit: err = %v, want stale with the lock's cause", err)
	}
	wantRow(t, direct, p.ID, 8, 8)
	_ = sql.ErrTxDone
}

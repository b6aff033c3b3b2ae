package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// TestService_PurchaseWhoseCommitAnswerIsLostIsNeitherRefusedNorDuplicated:
// the purchase's COMMIT reaches MariaDB and commits, and its answer is lost
// (the connection reset between the two) — with the lock kept, and with the
// lock's lease run out while the COMMIT was on its way. The buyer is told
// the outcome is unknown (503), the instance does not count the purchase as
// refused, and the retry with the same Idempotency-Key gets the order that
// was written; one order, one unit.
func TestService_PurchaseWhoseCommitAnswerIsLostIsNeitherRefusedNorDuplicated(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeGuard, ModeGuardLease} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			rs := testenv.Redis(t)
			dsn := testenv.MySQL(t)
			dbCfg, err := gomysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			proxy, err := faults.NewProxy(dbCfg.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			dbCfg.Addr = proxy.Addr
			b, err := OpenBackends(env(map[string]string{envRedisURL: "redis://" + rs.Addr, envMySQLDSN: dbCfg.FormatDSN()}), "")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.Close)
			b.Quiet()
			cfg := testConfig(t, mode)
			cfg.Lease = 300 * time.Millisecond
			ins, db := cluster(t, b, cfg, 1)
			in := ins[0]
			const sku = "sku-commit"
			putProduct(t, in, sku, 5)

			// The COMMIT that follows the order's INSERT.
			var mu sync.Mutex
			sawOrder := false
			match := func(chunk []byte) bool {
				mu.Lock()
				defer mu.Unlock()
				if bytes.Contains(chunk, []byte("INSERT INTO `orders`")) {
					sawOrder = true
				}
				return sawOrder && bytes.Contains(chunk, []byte("\x03COMMIT"))
			}
			lost := proxy.LoseReplyTo(match, func() {
				if mode != ModeGuardLease {
					return
				}
				// Hold the COMMIT until the lock's lease has run out.
				deadline := time.Now().Add(5 * time.Second)
				for rs.Do("EXISTS", "sku:"+sku) != int64(0) && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				time.Sleep(20 * time.Millisecond) // the local expiry's timer, which runs before Redis's
			})

			a := buyAt(t, in, sku, "u1", "k1")
			select {
			case <-lost:
			default:
				t.Fatalf("purchase answered %v and no COMMIT reply was lost: the fault did not fire", a)
			}
			if left, n := stockOf(t, db, sku), len(ordersOf(t, db, sku)); left != 4 || n != 1 {
				t.Fatalf("stock %d and %d orders after the lost answer, want 4 and 1: the COMMIT did not commit, so this test shows nothing", left, n)
			}
			if a.status != http.StatusServiceUnavailable || a.code() != "outcome_unknown" {
				t.Errorf("purchase whose COMMIT answer was lost: %v, want 503 outcome_unknown", a)
			}
			for _, by := range []string{refusedLockLost, refusedFence} {
				if n := counter(in, "seckill_stale_writes_refused_total", "by", by); n != 0 {
					t.Errorf("counted %v purchases refused by %s; the one purchase was written", n, by)
				}
			}

			retry := buyAt(t, in, sku, "u1", "k1")
			if retry.status != http.StatusCreated || retry.header.Get(guard.ReplayedHeader) != "true" {
				t.Fatalf("retry with the same key: %v, want the written order replayed", retry)
			}
			if left, n := stockOf(t, db, sku), len(ordersOf(t, db, sku)); left != 4 || n != 1 {
				t.Errorf("stock %d and %d orders after the retry, want 4 and 1", left, n)
			}
		})
	}
}

// TestService_RowLockRefusesAnOlderHolderBetweenTheReadAndTheWrite: a
// purchase reads the product row with SELECT ... FOR UPDATE inside the
// transaction that writes it, so an older lock holder that has not yet been
// told of its loss (token between the row's fence and the purchase's)
// cannot write between the purchase's read and its write: its write waits
// for the row lock, and once the purchase has committed the fence refuses
// it. Without the row lock (or with the read outside the transaction) its
// write would be accepted and then overwritten by stock = read - 1, a unit
// sold twice.
func TestService_RowLockRefusesAnOlderHolderBetweenTheReadAndTheWrite(t *testing.T) {
	t.Parallel()
	b, _ := realServers(t)
	ins, db := cluster(t, b, testConfig(t, ModeGuard), 1)
	in := ins[0]
	const sku = "sku-rowlock"
	putProduct(t, in, sku, 10)
	var before Product
	if err := db.Where("sku = ?", sku).Take(&before).Error; err != nil {
		t.Fatal(err)
	}
	older := fencing.Token(before.Fence) + 1 // newer than the row, older than any purchase's token

	// Between the purchase's read and its write, the older holder writes
	// on a connection of its own; the purchase goes on once that write has
	// either finished or been seen waiting for the row's lock.
	olderDone := make(chan error, 1)
	hook := func() {
		thread := make(chan int64, 1)
		go func() {
			olderDone <- db.Connection(func(conn *gorm.DB) error {
				var id int64
				if err := conn.Raw("SELECT CONNECTION_ID()").Scan(&id).Error; err != nil {
					thread <- 0
					return err
				}
				thread <- id
				ctx := fencing.WithToken(context.Background(), older)
				return conn.WithContext(ctx).Model(&Product{}).Where("sku = ?", sku).Update("stock", gorm.Expr("stock - 1")).Error
			})
		}()
		id := <-thread
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case err := <-olderDone:
				olderDone <- err
				return
			default:
			}
			// Waiting: InnoDB lists its transaction as in LOCK WAIT, or
			// the server has been running its UPDATE for 50 ms, on a row
			// the purchase holds locked. (MariaDB does not always list an
			// autocommit UPDATE that waits for its first row lock in
			// INNODB_TRX; its PROCESSLIST shows the statement running.)
			var waiting int64
			err := db.Raw(`SELECT (SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT')
				+ (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND COMMAND = 'Query' AND INFO LIKE 'UPDATE%' AND TIME_MS >= 50)`, id, id).Scan(&waiting).Error
			if err != nil {
				t.Error(err)
				return
			}
			if waiting > 0 {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Error("the older holder's write neither finished nor waited for the row lock within 10s")
	}
	in.svc.afterRead.Store(&hook)
	a := buyAt(t, in, sku, "u1", "")
	in.svc.afterRead.Store(nil)
	if a.status != http.StatusCreated {
		t.Fatalf("purchase: %v", a)
	}
	var olderErr error
	select {
	case olderErr = <-olderDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the older holder's write did not end within 10s of the purchase's answer")
	}
	if olderErr == nil {
		t.Fatalf("the older holder's write (token %d) was accepted between the purchase's read and its write; stock now %d with %d orders", older, stockOf(t, db, sku), len(ordersOf(t, db, sku)))
	}
	if !errors.Is(olderErr, fencing.ErrStale) {
		t.Fatalf("the older holder's write: %v, want refused as stale", olderErr)
	}
	if left, n := stockOf(t, db, sku), len(ordersOf(t, db, sku)); left != 9 || n != 1 {
		t.Errorf("stock %d and %d orders, want 9 and 1", left, n)
	}
}

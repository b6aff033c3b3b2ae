package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/gorm"
)

func TestStale_LateWriteOfEarlierHolderIsRejected(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 100, 0)
	const t1, t2 = fencing.Token(1000), fencing.Token(2000)

	// Holder 1 writes, loses its lock (a pause, a failover), holder 2 takes
	// over and writes, holder 1 wakes up and writes late.
	if err := db.WithContext(at(t1)).Model(&p).Update("stock", 99).Error; err != nil {
		t.Fatalf("holder 1: %v", err)
	}
	if err := db.WithContext(at(t2)).Model(&Product{ID: p.ID}).Update("stock", 98).Error; err != nil {
		t.Fatalf("holder 2: %v", err)
	}
	log.take()
	late := db.WithContext(at(t1)).Model(&Product{ID: p.ID}).Update("stock", 97)

	if sqls := log.take(); len(sqls) != 2 || countSelects(sqls) != 1 {
		t.Errorf("rejection sent %d statements %q, want the UPDATE and one SELECT", len(sqls), sqls)
	}
	wantStale(t, late.Error, "products", fmt.Sprintf("id=%d", p.ID), t1, t2)
	if late.RowsAffected != 0 {
		t.Errorf("RowsAffected = %d, want 0", late.RowsAffected)
	}
	wantRow(t, db, p.ID, 98, t2)
}

func TestStale_RejectionCostsOneSelectAndSuccessNone(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 10, 50)
	log.take()

	res := db.WithContext(at(60)).Model(&p).Update("stock", 9)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("fenced update: %v, %d rows", res.Error, res.RowsAffected)
	}
	if sqls := log.take(); len(sqls) != 1 {
		t.Errorf("accepted write sent %q, want only the UPDATE", sqls)
	}

	err := db.WithContext(at(55)).Model(&p).Update("stock", 8).Error
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("err = %v, want stale", err)
	}
	sqls := log.take()
	if len(sqls) != 2 || countSelects(sqls) != 1 {
		t.Fatalf("rejected write sent %q, want the UPDATE and one SELECT", sqls)
	}
	// GORM logs a statement when its callbacks are done, so the check
	// SELECT, which runs inside them, comes first.
	t.Logf("update: %s", sqls[1])
	t.Logf("check:  %s", sqls[0])
}

func TestStale_ReentrantLevelsWithSameTokenAllSucceed(t *testing.T) {
	t.Parallel()
	for _, foundRows := range []bool{false, true} {
		t.Run(fmt.Sprintf("clientFoundRows=%v", foundRows), func(t *testing.T) {
			t.Parallel()
			dsn := testenv.MySQL(t)
			if foundRows {
				dsn = withFoundRows(t, dsn)
			}
			db, _ := openWith(t, dsn, gormplugin.New(), &gorm.Config{})
			p := seed(t, db, "sku-1", 10, 3)
			ctx := at(5) // outer level; inner levels of a reentrant lock keep its token

			// A write that changes nothing but the fence (3 -> 5).
			res := db.WithContext(ctx).Model(&p).Update("stock", 10)
			if res.Error != nil || res.RowsAffected != 1 {
				t.Fatalf("outer: %v, %d rows", res.Error, res.RowsAffected)
			}
			// Inner level, same token, new value.
			if err := db.WithContext(ctx).Model(&p).Updates(map[string]any{"stock": 9}).Error; err != nil {
				t.Fatalf("inner: %v", err)
			}
			// Inner level repeating values and token exactly: MySQL changes
			// nothing; never stale.
			res = db.WithContext(ctx).Model(&p).Update("stock", 9)
			if res.Error != nil {
				t.Fatalf("repeat: %v", res.Error)
			}
			want := int64(0)
			if foundRows {
				want = 1
			}
			if res.RowsAffected != want {
				t.Errorf("repeat: RowsAffected = %d, want %d", res.RowsAffected, want)
			}
			// Save of the unchanged row, and a delete, with the same token.
			p = load(t, db, p.ID)
			if err := db.WithContext(ctx).Save(&p).Error; err != nil {
				t.Fatalf("save unchanged: %v", err)
			}
			wantRow(t, db, p.ID, 9, 5)
			if err := db.WithContext(ctx).Delete(&p).Error; err != nil {
				t.Fatalf("delete: %v", err)
			}
		})
	}
}

func TestStale_ConditionalUpdateMatchingNothingIsNotStale(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	soldOut := seed(t, db, "sold-out", 0, 5)
	newerSoldOut := seed(t, db, "newer-sold-out", 0, 9)
	log.take()

	for _, p := range []Product{soldOut, newerSoldOut} {
		res := db.WithContext(at(7)).Model(&Product{ID: p.ID}).
			Where("stock > ?", 0).
			Update("stock", gorm.Expr("stock - ?", 1))
		if res.Error != nil {
			t.Errorf("%s: err = %v, want none: the row does not match the caller's condition", p.SKU, res.Error)
		}
		if res.RowsAffected != 0 {
			t.Errorf("%s: RowsAffected = %d, want 0", p.SKU, res.RowsAffected)
		}
		if sqls := log.take(); len(sqls) != 2 || countSelects(sqls) != 1 {
			t.Errorf("%s: sent %q, want the UPDATE and one SELECT", p.SKU, sqls)
		}
		wantRow(t, db, p.ID, 0, p.Fence.Token())
		log.take()
	}
}

func TestStale_TransactionRollsBackItsOtherInserts(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 9)

	err := db.WithContext(at(5)).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{UserID: 1, SKU: "sku-1", IdemKey: "k1"}).Error; err != nil {
			return err
		}
		if err := tx.Create(&Ledger{Note: "sold sku-1"}).Error; err != nil {
			return err
		}
		return tx.Model(&p).Update("stock", gorm.Expr("stock - ?", 1)).Error
	})
	wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)

	var orders, ledgers int64
	db.Model(&Order{}).Count(&orders)
	db.Model(&Ledger{}).Count(&ledgers)
	if orders != 0 || ledgers != 0 {
		t.Errorf("after rollback: %d orders, %d ledger rows, want none", orders, ledgers)
	}
	wantRow(t, db, p.ID, 10, 9)
}

func TestStale_DetectedInsideTransactionWithOlderSnapshot(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 3)

	// The transaction reads first, which fixes its REPEATABLE READ snapshot
	// at fence 3; a newer holder then commits fence 9. A plain SELECT in the
	// transaction would still see 3 and call the rejected write "no match".
	tx := db.WithContext(at(5)).Begin()
	defer tx.Rollback()
	var before Product
	if err := tx.First(&before, p.ID).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.WithContext(at(9)).Model(&Product{ID: p.ID}).Update("stock", 7).Error; err != nil {
		t.Fatalf("newer holder: %v", err)
	}
	err := tx.Model(&before).Update("stock", 4).Error
	wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
}

func TestStale_OrConditionsStayInsideTheFence(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := seed(t, db, "a", 1, 9)
	b := seed(t, db, "b", 1, 9)

	err := db.WithContext(at(5)).Model(&Product{}).
		Where("id = ?", a.ID).Or("id = ?", b.ID).
		Update("stock", 0).Error
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("err = %v, want stale", err)
	}
	wantRow(t, db, a.ID, 1, 9)
	wantRow(t, db, b.ID, 1, 9)
}

func TestStale_BatchUpdateAppliesPerRowAndIsStaleOnlyWhenNoneApplied(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := seed(t, db, "batch-a", 1, 3)
	b := seed(t, db, "batch-b", 1, 9)
	c := seed(t, db, "batch-c", 1, 3)
	batch := db.Model(&Product{}).Where("sku LIKE ?", "batch-%")

	// Token 5 may overwrite a and c, not b: applied to two rows, no error.
	res := batch.WithContext(at(5)).Update("stock", 2)
	if res.Error != nil || res.RowsAffected != 2 {
		t.Fatalf("partial batch: %v, %d rows, want no error and 2 rows", res.Error, res.RowsAffected)
	}
	wantRow(t, db, a.ID, 2, 5)
	wantRow(t, db, b.ID, 1, 9)
	wantRow(t, db, c.ID, 2, 5)

	// Token 4 may overwrite none of them: stale, naming the newest fence.
	res = batch.WithContext(at(4)).Update("stock", 3)
	wantStale(t, res.Error, "products", fmt.Sprintf("id=%d", b.ID), 4, 9)
	wantRow(t, db, a.ID, 2, 5)
	wantRow(t, db, c.ID, 2, 5)
}

func TestStale_DoneContextIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 10, 5)
	log.take()

	ctx, cancel := context.WithCancelCause(at(5))
	cancel(errLost)
	writes := map[string]func(*gorm.DB) error{
		"update":         func(tx *gorm.DB) error { return tx.Model(&p).Update("stock", 0).Error },
		"delete":         func(tx *gorm.DB) error { return tx.Delete(&p).Error },
		"create":         func(tx *gorm.DB) error { return tx.Create(&Product{SKU: "new"}).Error },
		"unfenced-model": func(tx *gorm.DB) error { return tx.Create(&Ledger{Note: "x"}).Error },
	}
	for name, write := range writes {
		err := write(db.WithContext(ctx))
		for _, target := range []error{fencing.ErrStale, errLost, context.Canceled} {
			if !errors.Is(err, target) {
				t.Errorf("%s: err = %v, want it to match %v", name, err, target)
			}
		}
	}
	if sqls := log.take(); len(sqls) != 0 {
		t.Errorf("refused writes sent %q", sqls)
	}
	// Raw SQL is not fenced, but it is refused too. (GORM logs its SQL,
	// which exists before the callbacks run, without sending it.)
	err := db.WithContext(ctx).Exec("UPDATE products SET stock = 0").Error
	if !errors.Is(err, fencing.ErrStale) || !errors.Is(err, errLost) {
		t.Errorf("raw sql: err = %v, want stale with the lock's cause", err)
	}
	wantRow(t, db, p.ID, 10, 5)
}

// lossyProduct cancels its token context from a hook, after the plugin let
// the write through and before GORM sends it: the lock is lost in flight.
type lossyProduct struct {
	Product
	lose func(error) `gorm:"-"`
}

func (lossyProduct) TableName() string { return "products" }

func (p *lossyProduct) BeforeUpdate(*gorm.DB) error {
	p.lose(errLost)
	return nil
}

func TestStale_LockLostWhileWritingIsReportedAsStale(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 5)

	ctx, cancel := context.WithCancelCause(at(5))
	defer cancel(nil)
	lp := &lossyProduct{Product: p, lose: cancel}
	err := db.WithContext(ctx).Model(lp).Update("stock", 0).Error
	for _, target := range []error{fencing.ErrStale, errLost, context.Canceled} {
		if !errors.Is(err, target) {
			t.Errorf("err = %v, want it to match %v", err, target)
		}
	}
	wantRow(t, db, p.ID, 10, 5)
}

func TestStale_GlobalUpdateStillNeedsWhereOrAllowGlobalUpdate(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := seed(t, db, "a", 1, 3)
	b := seed(t, db, "b", 1, 9)

	err := db.WithContext(at(5)).Model(&Product{}).Update("stock", 0).Error
	if !errors.Is(err, gorm.ErrMissingWhereClause) {
		t.Fatalf("err = %v, want gorm.ErrMissingWhereClause: the fence must not count as a condition", err)
	}
	wantRow(t, db, a.ID, 1, 3)

	res := db.WithContext(at(5)).Session(&gorm.Session{AllowGlobalUpdate: true}).Model(&Product{}).Update("stock", 0)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("global update: %v, %d rows, want 1 row", res.Error, res.RowsAffected)
	}
	wantRow(t, db, a.ID, 0, 5)
	wantRow(t, db, b.ID, 1, 9)
}

func TestStale_ConcurrentWritersLoseNoUpdate(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 0, 0)
	const writers = 40
	tokens := rand.Perm(writers) // every writer its own token, in random order

	type result struct {
		token fencing.Token
		err   error
	}
	results := make(chan result, writers)
	var start sync.WaitGroup
	start.Add(1)
	for _, n := range tokens {
		go func(token fencing.Token) {
			start.Wait()
			err := db.WithContext(at(token)).Model(&Product{ID: p.ID}).Update("stock", gorm.Expr("stock + 1")).Error
			results <- result{token, err}
		}(fencing.Token(n + 1))
	}
	start.Done()

	accepted := 0
	for range writers {
		r := <-results
		switch {
		case r.err == nil:
			accepted++
		case errors.Is(r.err, fencing.ErrStale):
			if r.token == writers {
				t.Errorf("the newest token %d was refused: %v", r.token, r.err)
			}
		default:
			t.Errorf("token %d: %v", r.token, r.err)
		}
	}
	// Every accepted write counted once, every refused one not at all, and
	// the newest token holds the row.
	wantRow(t, db, p.ID, accepted, writers)
	t.Logf("%d of %d writes accepted", accepted, writers)
}

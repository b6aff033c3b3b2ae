package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/glebarez/sqlite"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

var sqliteSeq atomic.Int64

// openSQLite opens a fresh in-memory SQLite database (pure Go) with the
// plugin installed and the test models migrated, or only migrate when given
// (SQLite's index names are global, so Purchase and Order cannot share one
// database). The memdb VFS lets every connection of the pool see the same
// database.
func openSQLite(t *testing.T, cfg *gorm.Config, migrate ...any) *gorm.DB {
	t.Helper()
	dsn := fmt.Sprintf("file:/gormplugin-%d?vfs=memdb&_pragma=busy_timeout(5000)&_txlock=immediate", sqliteSeq.Add(1))
	log := &queryLog{}
	cfg.Logger = log
	if cfg.NowFunc == nil {
		cfg.NowFunc = fixedNow
	}
	db, err := gorm.Open(sqlite.Open(dsn), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	// The database lives as long as one connection to it is open.
	sqlDB.SetMaxOpenConns(4)
	sqlDB.SetMaxIdleConns(4)
	t.Cleanup(func() { _ = sqlDB.Close() })
	if err := db.Use(gormplugin.New()); err != nil {
		t.Fatalf("use plugin: %v", err)
	}
	if len(migrate) == 0 {
		migrate = models
	}
	if err := db.AutoMigrate(migrate...); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return db
}

// wantSQLiteDuplicate fails unless err is a *gormplugin.DuplicateError
// naming index of table, wrapping the driver's unique-violation error.
func wantSQLiteDuplicate(t *testing.T, err error, table, index string) {
	t.Helper()
	var de *gormplugin.DuplicateError
	if !errors.As(err, &de) {
		t.Fatalf("err = %T %v, want a *gormplugin.DuplicateError", err, err)
	}
	if de.Table != table || de.Index != index || de.Value != "" {
		t.Errorf("duplicate = table %q index %q value %q, want %q %q and no value", de.Table, de.Index, de.Value, table, index)
	}
	if !errors.Is(err, gormplugin.ErrDuplicate) || !errors.Is(err, gorm.ErrDuplicatedKey) {
		t.Errorf("err = %v, want it to match gormplugin.ErrDuplicate and gorm.ErrDuplicatedKey", err)
	}
	var coded interface{ Code() int }
	if !errors.As(err, &coded) || (coded.Code() != 2067 && coded.Code() != 1555) {
		t.Errorf("err = %v, want it to wrap the driver's SQLITE_CONSTRAINT_UNIQUE or _PRIMARYKEY error", err)
	}
}

func TestSQLite_FencedUpdateWritesTheToken(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 9)
	res := db.WithContext(at(12)).Model(&Product{}).Where("id = ?", p.ID).Update("stock", gorm.Expr("stock - 1"))
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("update: err %v, rows %d; want 1 row", res.Error, res.RowsAffected)
	}
	wantRow(t, db, p.ID, 99, 12)
}

func TestSQLite_StaleUpdateIsRefused(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 9)
	err := db.WithContext(at(5)).Model(&p).Update("stock", 1).Error
	wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantRow(t, db, p.ID, 100, 9)

	// A statement that matches no row is not stale.
	res := db.WithContext(at(5)).Model(&Product{}).Where("sku = ?", "none").Update("stock", 1)
	if res.Error != nil || res.RowsAffected != 0 {
		t.Fatalf("update of no row: err %v rows %d, want no error and 0 rows", res.Error, res.RowsAffected)
	}
}

func TestSQLite_StaleDeleteIsRefused(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 9)
	wantStale(t, db.WithContext(at(5)).Delete(&Product{}, p.ID).Error, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantRow(t, db, p.ID, 100, 9)
	if err := db.WithContext(at(10)).Delete(&Product{}, p.ID).Error; err != nil {
		t.Fatal(err)
	}
}

func TestSQLite_InsertWritesTheToken(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := Product{SKU: "sku-1", Stock: 3}
	if err := db.WithContext(at(7)).Create(&p).Error; err != nil {
		t.Fatal(err)
	}
	if p.Fence != 7 {
		t.Errorf("model fence %d after insert, want 7", p.Fence)
	}
	wantRow(t, db, p.ID, 3, 7)
}

func TestSQLite_LostLockWritesNothing(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 0)
	ctx, cancel := context.WithCancelCause(at(5))
	cancel(errLost)
	err := db.WithContext(ctx).Model(&p).Update("stock", 1).Error
	var se *fencing.StaleError
	if !errors.As(err, &se) || !errors.Is(err, errLost) {
		t.Fatalf("err = %v, want a *fencing.StaleError caused by the lost lock", err)
	}
	err = db.WithContext(ctx).Exec("UPDATE products SET stock = 1").Error
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("raw SQL under a lost lock: err = %v, want stale", err)
	}
	wantRow(t, db, p.ID, 100, 0)
}

func TestSQLite_DuplicateNamesTheViolatedIndex(t *testing.T) {
	t.Parallel()
	for _, translate := range []bool{false, true} {
		t.Run(fmt.Sprintf("TranslateError=%v", translate), func(t *testing.T) {
			t.Parallel()
			db := openSQLite(t, &gorm.Config{TranslateError: translate})
			for _, ctx := range []struct {
				name string
				db   *gorm.DB
			}{{"without token", db}, {"with token", db.WithContext(at(5))}} {
				tx := ctx.db
				first := Order{UserID: 1, SKU: "sku-" + ctx.name, IdemKey: "key-" + ctx.name}
				if err := tx.Create(&first).Error; err != nil {
					t.Fatalf("%s: first order: %v", ctx.name, err)
				}
				err := tx.Create(&Order{UserID: 1, SKU: "sku-" + ctx.name, IdemKey: "other-" + ctx.name}).Error
				wantSQLiteDuplicate(t, err, "orders", "idx_user_sku")
				err = tx.Create(&Order{UserID: 2, SKU: "other-" + ctx.name, IdemKey: "key-" + ctx.name}).Error
				wantSQLiteDuplicate(t, err, "orders", "idx_idem_key")
				err = tx.Create(&Order{ID: first.ID, UserID: 3, SKU: "third-" + ctx.name, IdemKey: "third-" + ctx.name}).Error
				wantSQLiteDuplicate(t, err, "orders", "PRIMARY")
			}
		})
	}
}

func TestSQLite_DuplicateOnUpdateAndInTransaction(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	a := seed(t, db, "sku-a", 1, 0)
	seed(t, db, "sku-b", 1, 0)
	wantSQLiteDuplicate(t, db.WithContext(at(5)).Model(&a).Update("sku", "sku-b").Error, "products", "idx_products_sku")

	err := db.WithContext(at(6)).Transaction(func(tx *gorm.DB) error {
		return tx.Create(&[]Order{
			{UserID: 1, SKU: "s", IdemKey: "k1"},
			{UserID: 1, SKU: "s", IdemKey: "k2"},
		}).Error
	})
	wantSQLiteDuplicate(t, err, "orders", "idx_user_sku")
	var n int64
	db.Model(&Order{}).Count(&n)
	if n != 0 {
		t.Errorf("%d orders after a rolled-back batch, want 0", n)
	}
}

func TestSQLite_WritesWithoutModelNameTheIndexFromTheDatabase(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	seed(t, db, "sku-a", 1, 0)
	err := db.Exec("INSERT INTO products (sku, stock) VALUES (?, ?)", "sku-a", 2).Error
	wantSQLiteDuplicate(t, err, "products", "idx_products_sku")

	if err := db.Table("orders").Create(map[string]any{"user_id": 1, "sku": "s", "idem_key": "k"}).Error; err != nil {
		t.Fatal(err)
	}
	err = db.Table("orders").Create(map[string]any{"user_id": 2, "sku": "t", "idem_key": "k"}).Error
	wantSQLiteDuplicate(t, err, "orders", "idx_idem_key")
}

func TestSQLite_UpsertStaleRowIsNotOverwritten(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 9)
	upsert := func(tx *gorm.DB, stock int) error {
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Product{ID: p.ID, SKU: "sku-1", Stock: stock}).Error
	}
	wantStale(t, upsert(db.WithContext(at(5)), 50), "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantRow(t, db, p.ID, 100, 9)
	if err := upsert(db.WithContext(at(12)), 120); err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 120, 12)
}

func TestSQLite_UpsertByOnConflictColumns(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{})
	p := seed(t, db, "sku-1", 100, 9)
	upsert := func(tx *gorm.DB, stock int) error {
		return tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "sku"}},
			DoUpdates: clause.Assignments(map[string]any{"stock": gorm.Expr("stock + ?", stock)}),
		}).Create(&Product{SKU: "sku-1", Stock: stock}).Error
	}
	wantStale(t, upsert(db.WithContext(at(5)), 1), "products", "sku=sku-1", 5, 9)
	wantRow(t, db, p.ID, 100, 9)
	if err := upsert(db.WithContext(at(12)), 1); err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 101, 12)
	// A new row is inserted with the token.
	if err := upsert(db.WithContext(at(13)), 4); err != nil {
		t.Fatal(err)
	}
	var q Product
	if err := db.Where("sku = ?", "sku-1").Take(&q).Error; err != nil || q.Stock != 105 {
		t.Fatalf("after a third upsert: %+v, %v", q, err)
	}
}

// TestSQLite_BuyFlow runs the Example's buy against SQLite.
func TestSQLite_BuyFlow(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, &gorm.Config{}, &Item{}, &Purchase{})
	if err := db.Create(&Item{SKU: "sku-42", Stock: 3}).Error; err != nil {
		t.Fatal(err)
	}
	var dup *gormplugin.DuplicateError
	if err := buy(at(5), db, 7, "sku-42", "k1"); err != nil {
		t.Fatalf("first purchase: %v", err)
	}
	if err := buy(at(5), db, 7, "sku-42", "k2"); !errors.As(err, &dup) || dup.Index != "idx_user_sku" {
		t.Fatalf("same user again: %v, want a duplicate of idx_user_sku", err)
	}
	if err := buy(at(5), db, 8, "sku-42", "k1"); !errors.As(err, &dup) || dup.Index != "idx_idem_key" {
		t.Fatalf("key reused: %v, want a duplicate of idx_idem_key", err)
	}
	if err := buy(at(9), db, 9, "sku-42", "k3"); err != nil {
		t.Fatalf("newer holder: %v", err)
	}
	if err := buy(at(5), db, 10, "sku-42", "k4"); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("late holder: %v, want stale", err)
	}
	if err := buy(at(11), db, 11, "sku-42", "k5"); err != nil {
		t.Fatalf("last unit: %v", err)
	}
	if err := buy(at(12), db, 12, "sku-42", "k6"); !errors.Is(err, errSoldOut) {
		t.Fatalf("after the last unit: %v, want sold out", err)
	}
	var item Item
	var purchases int64
	db.First(&item)
	db.Model(&Purchase{}).Count(&purchases)
	if item.Stock != 0 || item.Fence != 11 || purchases != 3 {
		t.Errorf("stock %d fence %d purchases %d, want 0, 11, 3", item.Stock, item.Fence, purchases)
	}
}

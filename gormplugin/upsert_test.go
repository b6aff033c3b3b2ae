package gormplugin_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/seckillguard/seckillguard/gormplugin"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

func TestUpsert_StaleRowIsNotOverwritten(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 100, 9)
	upsert := func(tx *gorm.DB, stock int) error {
		return tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Product{ID: p.ID, SKU: "sku-1", Stock: stock}).Error
	}
	log.take()

	wantStale(t, upsert(db.WithContext(at(5)), 50), "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	if sqls := log.take(); len(sqls) != 2 || countSelects(sqls) != 1 {
		t.Errorf("stale upsert sent %q, want the INSERT and one SELECT", sqls)
	}
	wantRow(t, db, p.ID, 100, 9)

	if err := upsert(db.WithContext(at(12)), 120); err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 120, 12)
}

func TestUpsert_ByOnConflictColumns(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
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
}

func TestUpsert_WithoutKeyIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 9)
	err := db.WithContext(at(5)).Clauses(clause.OnConflict{UpdateAll: true}).Create(&Product{SKU: "sku-1", Stock: 1}).Error
	if !errors.Is(err, gormplugin.ErrUnsupported) {
		t.Fatalf("err = %v, want ErrUnsupported", err)
	}
	// GORM builds (and logs) the statement but does not send it.
	wantRow(t, db, p.ID, 100, 9)
}

func TestUpsert_DoNothingIsNotStale(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 9)
	res := db.WithContext(at(5)).Clauses(clause.OnConflict{DoNothing: true}).Create(&Product{ID: p.ID, SKU: "sku-1", Stock: 1})
	if res.Error != nil {
		t.Fatalf("err = %v: an insert that does nothing on conflict overwrites nothing", res.Error)
	}
	wantRow(t, db, p.ID, 100, 9)
}

func TestSave_MissingRowIsInsertedWithToken(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := Product{ID: 77, SKU: "new", Stock: 3}
	if err := db.WithContext(at(5)).Save(&p).Error; err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, 77, 3, 5)
}

func TestSave_SliceWithOneStaleRowIsRolledBack(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := seed(t, db, "a", 1, 3)
	b := seed(t, db, "b", 1, 9)

	err := db.WithContext(at(5)).Save(&[]Product{
		{ID: a.ID, SKU: "a", Stock: 50},
		{ID: b.ID, SKU: "b", Stock: 50},
		{ID: 99, SKU: "c", Stock: 50},
	}).Error
	wantStale(t, err, "products", fmt.Sprintf("id=%d", b.ID), 5, 9)
	// GORM's default transaction rolls the whole statement back.
	wantRow(t, db, a.ID, 1, 3)
	wantRow(t, db, b.ID, 1, 9)
	var n int64
	db.Model(&Product{}).Where("id = ?", 99).Count(&n)
	if n != 0 {
		t.Errorf("row 99 was inserted by a rejected statement")
	}
}

func TestUpsert_ByCompositeOnConflictColumns(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	if err := db.WithContext(at(9)).Create(&Order{UserID: 1, SKU: "s", IdemKey: "k1"}).Error; err != nil {
		t.Fatal(err)
	}
	upsert := func(tx *gorm.DB, key string) error {
		return tx.Clauses(clause.OnConflict{
			Columns:   []clause.Column{{Name: "user_id"}, {Name: "sku"}},
			DoUpdates: clause.AssignmentColumns([]string{"idem_key"}),
		}).Create(&Order{UserID: 1, SKU: "s", IdemKey: key}).Error
	}
	wantStale(t, upsert(db.WithContext(at(5)), "k2"), "orders", "user_id=1,sku=s", 5, 9)
	if err := upsert(db.WithContext(at(12)), "k3"); err != nil {
		t.Fatal(err)
	}
	var o Order
	if err := db.First(&o).Error; err != nil {
		t.Fatal(err)
	}
	if o.IdemKey != "k3" || o.Fence != 12 {
		t.Errorf("order: key %q fence %d, want k3, 12", o.IdemKey, o.Fence)
	}
}

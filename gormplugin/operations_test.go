package gormplugin_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
)

// overtake writes the product with token 9 (accepted), then with token 5
// (stale: 9 got there first; the row keeps 9's data), then with token 12
// (accepted). write sets the stock of product id to stock.
func overtake(t *testing.T, write func(tx *gorm.DB, id uint, stock int) *gorm.DB) {
	t.Helper()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 0)

	if err := write(db.WithContext(at(9)), p.ID, 90).Error; err != nil {
		t.Fatalf("token 9: %v", err)
	}
	wantRow(t, db, p.ID, 90, 9)

	err := write(db.WithContext(at(5)), p.ID, 50).Error
	wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantRow(t, db, p.ID, 90, 9)

	if err := write(db.WithContext(at(12)), p.ID, 120).Error; err != nil {
		t.Fatalf("token 12: %v", err)
	}
	wantRow(t, db, p.ID, 120, 12)
}

func TestFenced_Save(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		p := Product{ID: id, SKU: "sku-1", Stock: stock} // fence 0 in memory
		return tx.Save(&p)
	})
}

func TestFenced_SaveRecordsTokenInModel(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 3)
	p.Stock = 99
	if err := db.WithContext(at(8)).Save(&p).Error; err != nil {
		t.Fatal(err)
	}
	if p.Fence != 8 {
		t.Errorf("p.Fence = %d after a fenced save, want 8", p.Fence)
	}
}

func TestFenced_Update(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).Update("stock", stock)
	})
}

func TestFenced_UpdatesMap(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).Updates(map[string]any{"stock": stock})
	})
}

func TestFenced_UpdatesStruct(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).Updates(Product{Stock: stock})
	})
}

func TestFenced_UpdatesWithSelectLeavingFenceOut(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).Select("stock").Updates(Product{Stock: stock, Fence: 1})
	})
}

func TestFenced_UpdateColumn(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).UpdateColumn("stock", stock)
	})
}

func TestFenced_UpdateColumns(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{ID: id}).UpdateColumns(map[string]any{"stock": stock})
	})
}

func TestFenced_UpdateByConditionWithoutModelKey(t *testing.T) {
	t.Parallel()
	overtake(t, func(tx *gorm.DB, id uint, stock int) *gorm.DB {
		return tx.Model(&Product{}).Where("sku = ?", "sku-1").Update("stock", stock)
	})
}

func TestFenced_Expression(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 0)
	decrement := func(tx *gorm.DB) *gorm.DB {
		return tx.Model(&Product{ID: p.ID}).Where("stock > ?", 0).Update("stock", gorm.Expr("stock - ?", 1))
	}

	if err := decrement(db.WithContext(at(9))).Error; err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 99, 9)
	wantStale(t, decrement(db.WithContext(at(5))).Error, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantRow(t, db, p.ID, 99, 9)
	if err := decrement(db.WithContext(at(12))).Error; err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 98, 12)
}

func TestFenced_Delete(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 100, 9)
	q := seed(t, db, "sku-2", 100, 9)

	wantStale(t, db.WithContext(at(5)).Delete(&p).Error, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	wantStale(t, db.WithContext(at(5)).Delete(&Product{}, q.ID).Error, "products", fmt.Sprintf("id=%d", q.ID), 5, 9)
	wantRow(t, db, p.ID, 100, 9)
	wantRow(t, db, q.ID, 100, 9)

	for _, id := range []uint{p.ID, q.ID} {
		res := db.WithContext(at(12)).Delete(&Product{}, id)
		if res.Error != nil || res.RowsAffected != 1 {
			t.Fatalf("delete %d at 12: %v, %d rows", id, res.Error, res.RowsAffected)
		}
	}
	var n int64
	db.Model(&Product{}).Count(&n)
	if n != 0 {
		t.Errorf("%d products left, want 0", n)
	}
}

func TestFenced_SoftDeleteWithRenamedColumn(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := Account{Balance: 10}
	if err := db.WithContext(at(9)).Create(&a).Error; err != nil {
		t.Fatal(err)
	}

	wantStale(t, db.WithContext(at(5)).Delete(&a).Error, "accounts", fmt.Sprintf("id=%d", a.ID), 5, 9)
	var live int64
	db.Model(&Account{}).Count(&live)
	if live != 1 {
		t.Fatalf("stale soft delete removed the account")
	}

	if err := db.WithContext(at(12)).Delete(&a).Error; err != nil {
		t.Fatal(err)
	}
	var got Account
	if err := db.Unscoped().First(&got, a.ID).Error; err != nil {
		t.Fatal(err)
	}
	if !got.DeletedAt.Valid || got.Fence != 12 {
		t.Errorf("after soft delete at 12: deleted %v, lock_token %d; want deleted, 12", got.DeletedAt.Valid, got.Fence)
	}
}

func TestFenced_CreateWritesToken(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	ctx := at(7)

	one := Product{SKU: "one", Fence: 3} // the token wins over the value in memory
	if err := db.WithContext(ctx).Create(&one).Error; err != nil {
		t.Fatal(err)
	}
	if one.Fence != 7 {
		t.Errorf("one.Fence = %d in memory, want 7", one.Fence)
	}
	batch := []Product{{SKU: "b1"}, {SKU: "b2"}, {SKU: "b3"}}
	if err := db.WithContext(ctx).Create(&batch).Error; err != nil {
		t.Fatal(err)
	}
	chunked := []*Product{{SKU: "c1"}, {SKU: "c2"}, {SKU: "c3"}}
	if err := db.WithContext(ctx).CreateInBatches(chunked, 2).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.WithContext(ctx).Model(&Product{}).Create(map[string]any{"sku": "from-map", "stock": 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.WithContext(ctx).Select("sku").Create(&Product{SKU: "selected"}).Error; err != nil {
		t.Fatal(err)
	}
	for _, p := range append(batch, *chunked[0], *chunked[2]) {
		if p.Fence != 7 {
			t.Errorf("%s: Fence = %d in memory, want 7", p.SKU, p.Fence)
		}
	}

	var rows []Product
	if err := db.Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 9 {
		t.Fatalf("%d rows, want 9", len(rows))
	}
	for _, p := range rows {
		if p.Fence != 7 {
			t.Errorf("%s: fence %d in the database, want 7", p.SKU, p.Fence)
		}
	}
}

func TestFenced_RecordTokenStaysOffTheModelWhenNothingChanged(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	p := seed(t, db, "sku-1", 0, 3)
	m := Product{ID: p.ID, Fence: 3}
	res := db.WithContext(at(8)).Model(&m).Where("stock > 0").Update("stock", 1)
	if res.Error != nil || res.RowsAffected != 0 {
		t.Fatalf("%v, %d rows", res.Error, res.RowsAffected)
	}
	if m.Fence != 3 {
		t.Errorf("m.Fence = %d after a write that matched nothing, want 3", m.Fence)
	}
	if errors.Is(res.Error, fencing.ErrStale) {
		t.Error("unmatched write reported stale")
	}
}

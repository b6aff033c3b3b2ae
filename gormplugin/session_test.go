package gormplugin_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
	"gorm.io/gorm"
)

func TestSession_PreparedStatementsAndNoDefaultTransaction(t *testing.T) {
	t.Parallel()
	for _, s := range []struct {
		name    string
		session gorm.Session
	}{
		{"PrepareStmt", gorm.Session{PrepareStmt: true}},
		{"SkipDefaultTransaction", gorm.Session{SkipDefaultTransaction: true}},
		{"both", gorm.Session{PrepareStmt: true, SkipDefaultTransaction: true}},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			base, _ := open(t)
			p := seed(t, base, "sku-1", 10, 0)
			session := s.session
			db := base.Session(&session)

			if err := db.WithContext(at(9)).Model(&p).Update("stock", 9).Error; err != nil {
				t.Fatal(err)
			}
			err := db.WithContext(at(5)).Model(&p).Update("stock", 5).Error
			wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
			err = db.WithContext(at(5)).Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&Ledger{Note: "x"}).Error; err != nil {
					return err
				}
				return tx.Delete(&p).Error
			})
			wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
			var n int64
			base.Model(&Ledger{}).Count(&n)
			if n != 0 {
				t.Errorf("%d ledger rows after rollback", n)
			}
			wantRow(t, base, p.ID, 9, 9)
		})
	}
}

func TestSession_TokenFromSessionContext(t *testing.T) {
	t.Parallel()
	base, _ := open(t)
	p := seed(t, base, "sku-1", 10, 9)
	db := base.Session(&gorm.Session{Context: at(5)})
	if err := db.Model(&p).Update("stock", 1).Error; !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("err = %v, want stale", err)
	}
	// The innermost token counts: a nested lock's context replaces it.
	if err := db.WithContext(fencing.WithToken(db.Statement.Context, 12)).Model(&p).Update("stock", 1).Error; err != nil {
		t.Fatal(err)
	}
	wantRow(t, base, p.ID, 1, 12)
}

// hookedProduct records its hooks; its BeforeUpdate also changes a column.
type hookedProduct struct {
	Product
	calls  []string `gorm:"-"`
	refuse bool     `gorm:"-"`
}

func (hookedProduct) TableName() string { return "products" }

var errRefusedByHook = errors.New("refused by hook")

func (p *hookedProduct) BeforeUpdate(tx *gorm.DB) error {
	p.calls = append(p.calls, "before")
	if p.refuse {
		return errRefusedByHook
	}
	tx.Statement.SetColumn("sku", p.SKU+"-touched")
	return nil
}

func (p *hookedProduct) AfterUpdate(*gorm.DB) error {
	p.calls = append(p.calls, "after")
	return nil
}

func TestHooks_RunAroundFencedWrites(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 10, 0)

	h := &hookedProduct{Product: p}
	if err := db.WithContext(at(9)).Model(h).Updates(map[string]any{"stock": 9}).Error; err != nil {
		t.Fatal(err)
	}
	if got := load(t, db, p.ID); got.SKU != "sku-1-touched" || got.Stock != 9 || got.Fence != 9 {
		t.Errorf("after fenced update with hooks: %+v", got)
	}
	if fmt.Sprint(h.calls) != "[before after]" {
		t.Errorf("hooks = %v, want [before after]", h.calls)
	}

	// A stale write runs BeforeUpdate but not AfterUpdate.
	h = &hookedProduct{Product: load(t, db, p.ID)}
	err := db.WithContext(at(5)).Model(h).Updates(map[string]any{"stock": 5}).Error
	wantStale(t, err, "products", fmt.Sprintf("id=%d", p.ID), 5, 9)
	if fmt.Sprint(h.calls) != "[before]" {
		t.Errorf("hooks = %v, want [before]", h.calls)
	}

	// A hook that refuses stops the write before anything is sent.
	log.take()
	h = &hookedProduct{Product: load(t, db, p.ID), refuse: true}
	log.take()
	if err := db.WithContext(at(12)).Model(h).Update("stock", 12).Error; !errors.Is(err, errRefusedByHook) {
		t.Fatalf("err = %v, want the hook's error", err)
	}
	if sqls := log.take(); len(sqls) != 0 {
		t.Errorf("refused write sent %q", sqls)
	}
}

package gormplugin_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// writes is one of every kind of write the plugin fences, each on rows the
// previous ones left behind. They carry no token unless the context does.
var writes = []struct {
	name string
	run  func(db *gorm.DB) error
}{
	{"create", func(db *gorm.DB) error { return db.Create(&Product{SKU: "a", Stock: 5}).Error }},
	{"batch create", func(db *gorm.DB) error {
		return db.Create(&[]Product{{SKU: "b", Stock: 5}, {SKU: "c", Stock: 5}}).Error
	}},
	{"create from map", func(db *gorm.DB) error {
		return db.Model(&Product{}).Create(map[string]any{"sku": "d", "stock": 1}).Error
	}},
	{"save", func(db *gorm.DB) error { return db.Save(&Product{ID: 1, SKU: "a", Stock: 4}).Error }},
	{"save of a missing row", func(db *gorm.DB) error { return db.Save(&Product{ID: 40, SKU: "e", Stock: 4}).Error }},
	{"save of a slice", func(db *gorm.DB) error {
		return db.Save(&[]Product{{ID: 2, SKU: "b", Stock: 3}, {ID: 41, SKU: "f", Stock: 3}}).Error
	}},
	{"update", func(db *gorm.DB) error { return db.Model(&Product{ID: 1}).Update("stock", 3).Error }},
	{"updates map", func(db *gorm.DB) error {
		return db.Model(&Product{ID: 1}).Updates(map[string]any{"stock": 2}).Error
	}},
	{"updates struct", func(db *gorm.DB) error { return db.Model(&Product{ID: 1}).Updates(Product{Stock: 1}).Error }},
	{"update column", func(db *gorm.DB) error { return db.Model(&Product{ID: 2}).UpdateColumn("stock", 9).Error }},
	{"update columns", func(db *gorm.DB) error {
		return db.Model(&Product{ID: 2}).UpdateColumns(Product{Stock: 8}).Error
	}},
	{"expression", func(db *gorm.DB) error {
		return db.Model(&Product{ID: 2}).Where("stock > ?", 0).Update("stock", gorm.Expr("stock - ?", 1)).Error
	}},
	{"batch update", func(db *gorm.DB) error {
		return db.Model(&Product{}).Where("stock < ?", 100).Update("stock", gorm.Expr("stock + 1")).Error
	}},
	{"or conditions", func(db *gorm.DB) error {
		return db.Model(&Product{}).Where("id = ?", 1).Or("id = ?", 2).Update("stock", 7).Error
	}},
	{"upsert", func(db *gorm.DB) error {
		return db.Clauses(clause.OnConflict{UpdateAll: true}).Create(&Product{ID: 3, SKU: "c", Stock: 6}).Error
	}},
	{"update that matches nothing", func(db *gorm.DB) error {
		return db.Model(&Product{ID: 1}).Where("stock > ?", 1000).Update("stock", 0).Error
	}},
	{"create account", func(db *gorm.DB) error { return db.Create(&Account{Balance: 10}).Error }},
	{"soft delete", func(db *gorm.DB) error { return db.Delete(&Account{ID: 1}).Error }},
	{"delete", func(db *gorm.DB) error { return db.Delete(&Product{ID: 3}).Error }},
	{"delete by condition", func(db *gorm.DB) error { return db.Where("sku = ?", "d").Delete(&Product{}).Error }},
	{"unfenced model", func(db *gorm.DB) error { return db.Create(&Ledger{Note: "n"}).Error }},
}

func TestNoToken_SameSQLAsPlainGORM(t *testing.T) {
	t.Parallel()
	plain, _ := openWith(t, testenv.MySQL(t), nil, &gorm.Config{})
	fenced, _ := open(t)
	for _, w := range writes {
		want := plain.ToSQL(func(tx *gorm.DB) *gorm.DB { _ = w.run(tx); return tx })
		got := fenced.ToSQL(func(tx *gorm.DB) *gorm.DB { _ = w.run(tx); return tx })
		if got != want {
			t.Errorf("%s:\n got %s\nwant %s", w.name, got, want)
		}
	}
}

func TestNoToken_SameStatementsAsPlainGORMAndNoExtraQuery(t *testing.T) {
	t.Parallel()
	plain, plainLog := openWith(t, testenv.MySQL(t), nil, &gorm.Config{})
	fenced, fencedLog := open(t)
	for _, w := range writes {
		wantErr := w.run(plain)
		gotErr := w.run(fenced)
		if (gotErr == nil) != (wantErr == nil) {
			t.Errorf("%s: err = %v, plain GORM: %v", w.name, gotErr, wantErr)
		}
		want, got := plainLog.take(), fencedLog.take()
		if !slices.Equal(got, want) {
			t.Errorf("%s: sent\n%s\nplain GORM sent\n%s", w.name, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

func TestWithToken_EveryWriteIsFencedAndSucceedsWhenNotOvertaken(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	for _, w := range writes {
		if err := w.run(db.WithContext(at(5))); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		for _, sql := range log.take() {
			upper := strings.ToUpper(sql)
			fenced := strings.Contains(upper, "FENCE") || strings.Contains(upper, "LOCK_TOKEN")
			if !fenced && !strings.Contains(upper, "LEDGERS") {
				t.Errorf("%s: unfenced statement %s", w.name, sql)
			}
		}
	}
}

func TestStrict_RefusesWritesWithoutToken(t *testing.T) {
	t.Parallel()
	db, log := open(t, gormplugin.Strict())
	refused := map[string]func(*gorm.DB) error{
		"create": func(tx *gorm.DB) error { return tx.Create(&Product{SKU: "a"}).Error },
		"update": func(tx *gorm.DB) error { return tx.Model(&Product{ID: 1}).Update("stock", 1).Error },
		"save":   func(tx *gorm.DB) error { return tx.Save(&Product{ID: 1, SKU: "a"}).Error },
		"delete": func(tx *gorm.DB) error { return tx.Delete(&Product{ID: 1}).Error },
		"soft delete": func(tx *gorm.DB) error {
			return tx.Delete(&Account{ID: 1}).Error
		},
	}
	for name, write := range refused {
		err := write(db)
		if !errors.Is(err, gormplugin.ErrNoToken) {
			t.Errorf("%s without token: err = %v, want ErrNoToken", name, err)
		} else if !strings.Contains(err.Error(), "products") && !strings.Contains(err.Error(), "accounts") {
			t.Errorf("%s: %q does not name the table", name, err)
		}
	}
	if sqls := log.take(); len(sqls) != 0 {
		t.Errorf("refused writes sent %q", sqls)
	}

	if err := db.Create(&Ledger{Note: "no fence column, no token needed"}).Error; err != nil {
		t.Errorf("unfenced model: %v", err)
	}
	p := Product{SKU: "a"}
	if err := db.WithContext(at(5)).Create(&p).Error; err != nil {
		t.Fatalf("create with token: %v", err)
	}
	if err := db.WithContext(at(5)).Model(&p).Update("stock", 1).Error; err != nil {
		t.Errorf("update with token: %v", err)
	}
	var n int64
	db.Model(&Product{}).Count(&n) // reads need no token
	if n != 1 {
		t.Errorf("%d products, want 1", n)
	}
}

func TestNotInstalled_TokenWriteToFencedModelIsRefused(t *testing.T) {
	t.Parallel()
	db, _ := openWith(t, testenv.MySQL(t), nil, &gorm.Config{})
	for name, write := range map[string]func(*gorm.DB) error{
		"create": func(tx *gorm.DB) error { return tx.Create(&Product{SKU: "a"}).Error },
		"update": func(tx *gorm.DB) error { return tx.Model(&Product{ID: 1}).Update("stock", 1).Error },
		"delete": func(tx *gorm.DB) error { return tx.Delete(&Product{ID: 1}).Error },
	} {
		if err := write(db.WithContext(at(5))); !errors.Is(err, gormplugin.ErrNotInstalled) {
			t.Errorf("%s: err = %v, want ErrNotInstalled", name, err)
		}
	}
	if err := db.Create(&Product{SKU: "a"}).Error; err != nil {
		t.Errorf("token-less write without the plugin: %v", err)
	}
}

func TestFence_ColumnIsBigintNotNullDefaultZero(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	for _, col := range []struct{ table, column string }{{"products", "fence"}, {"accounts", "lock_token"}} {
		var c struct {
			ColumnType    string
			IsNullable    string
			ColumnDefault string
		}
		err := db.Raw(`SELECT COLUMN_TYPE AS column_type, IS_NULLABLE AS is_nullable, COLUMN_DEFAULT AS column_default
			FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`,
			col.table, col.column).Scan(&c).Error
		if err != nil {
			t.Fatal(err)
		}
		if c.ColumnType != "bigint(20)" && c.ColumnType != "bigint" || c.IsNullable != "NO" || c.ColumnDefault != "0" {
			t.Errorf("%s.%s: %+v, want BIGINT NOT NULL DEFAULT 0", col.table, col.column, c)
		}
	}
	log.take()
	if err := db.AutoMigrate(models...); err != nil {
		t.Fatal(err)
	}
	for _, sql := range log.take() {
		if strings.HasPrefix(sql, "ALTER") {
			t.Errorf("second migration altered the schema: %s", sql)
		}
	}
}

// otherDialect is a dialect the plugin does not support.
type otherDialect struct{ gorm.Dialector }

func (otherDialect) Name() string { return "postgres" }

func TestPlugin_RefusesDialectsOtherThanMySQL(t *testing.T) {
	db := &gorm.DB{Config: &gorm.Config{Dialector: otherDialect{}}}
	if err := gormplugin.New().Initialize(db); err == nil || !strings.Contains(err.Error(), "postgres") {
		t.Errorf("Initialize on postgres: %v, want an error naming the dialect", err)
	}
}

func TestNoToken_ContextWithoutTokenRunsPlain(t *testing.T) {
	t.Parallel()
	db, log := open(t)
	p := seed(t, db, "sku-1", 1, 9)
	log.take()
	// A cancelled context without a token is GORM's business, not a stale write.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := db.WithContext(ctx).Model(&p).Update("stock", 0).Error
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if strings.Contains(err.Error(), "stale") {
		t.Errorf("token-less write reported stale: %v", err)
	}
}

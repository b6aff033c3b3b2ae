package gormplugin_test

import (
	"errors"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/gorm"
)

// wantDuplicate fails unless err is a *gormplugin.DuplicateError naming
// index of table with value.
func wantDuplicate(t *testing.T, err error, table, index, value string) {
	t.Helper()
	var de *gormplugin.DuplicateError
	if !errors.As(err, &de) {
		t.Fatalf("err = %T %v, want a *gormplugin.DuplicateError", err, err)
	}
	if de.Table != table || de.Index != index || de.Value != value {
		t.Errorf("duplicate = table %q index %q value %q, want %q %q %q", de.Table, de.Index, de.Value, table, index, value)
	}
	if !errors.Is(err, gormplugin.ErrDuplicate) || !errors.Is(err, gorm.ErrDuplicatedKey) {
		t.Errorf("err = %v, want it to match gormplugin.ErrDuplicate and gorm.ErrDuplicatedKey", err)
	}
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1062 {
		t.Errorf("err = %v, want it to wrap the driver's error 1062", err)
	}
}

func TestDuplicate_InsertNamesTheViolatedIndex(t *testing.T) {
	t.Parallel()
	for _, translate := range []bool{false, true} {
		name := "TranslateError=false"
		if translate {
			name = "TranslateError=true"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, _ := openWith(t, testenv.MySQL(t), gormplugin.New(), &gorm.Config{TranslateError: translate})
			for _, ctx := range []struct {
				name string
				db   *gorm.DB
			}{{"without token", db}, {"with token", db.WithContext(at(5))}} {
				tx := ctx.db
				if err := tx.Create(&Order{UserID: 1, SKU: "sku-" + ctx.name, IdemKey: "key-" + ctx.name}).Error; err != nil {
					t.Fatalf("%s: first order: %v", ctx.name, err)
				}
				// Same user, same SKU, new idempotency key: already ordered.
				err := tx.Create(&Order{UserID: 1, SKU: "sku-" + ctx.name, IdemKey: "other-" + ctx.name}).Error
				wantDuplicate(t, err, "orders", "idx_user_sku", "1-sku-"+ctx.name)
				// Another user and SKU, same idempotency key: key reused.
				err = tx.Create(&Order{UserID: 2, SKU: "other-" + ctx.name, IdemKey: "key-" + ctx.name}).Error
				wantDuplicate(t, err, "orders", "idx_idem_key", "key-"+ctx.name)
			}
		})
	}
}

func TestDuplicate_UpdateNamesTheViolatedIndex(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	a := seed(t, db, "sku-a", 1, 0)
	seed(t, db, "sku-b", 1, 0)
	err := db.WithContext(at(5)).Model(&a).Update("sku", "sku-b").Error
	wantDuplicate(t, err, "products", "idx_products_sku", "sku-b")
}

func TestDuplicate_BatchInsertAndTransaction(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	err := db.WithContext(at(5)).Transaction(func(tx *gorm.DB) error {
		return tx.Create(&[]Order{
			{UserID: 1, SKU: "s", IdemKey: "k1"},
			{UserID: 1, SKU: "s", IdemKey: "k2"},
		}).Error
	})
	wantDuplicate(t, err, "orders", "idx_user_sku", "1-s")
}

func TestDuplicate_RawExecNamesTheIndex(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	seed(t, db, "sku-a", 1, 0)
	err := db.Exec("INSERT INTO products (sku, stock) VALUES (?, ?)", "sku-a", 2).Error
	var de *gormplugin.DuplicateError
	if !errors.As(err, &de) || de.Index != "idx_products_sku" || de.Value != "sku-a" {
		t.Fatalf("err = %v, want a duplicate of idx_products_sku", err)
	}
}

// MariaDB prints the duplicate value unescaped: an idempotency key of the
// client's choice such as "k' for key 'idx_user_sku" puts the words of
// another index into the message. The index is read from the end of the
// message, where client data cannot reach, so that a reused key is never
// taken for "already ordered" (the reference service tells the two apart
// by the index's name).
func TestDuplicate_ClientDataCannotForgeTheIndexName(t *testing.T) {
	t.Parallel()
	db, _ := open(t)
	forged := "k' for key 'idx_user_sku"
	if err := db.Create(&Order{UserID: 1, SKU: "sku-1", IdemKey: forged}).Error; err != nil {
		t.Fatal(err)
	}
	err := db.Create(&Order{UserID: 2, SKU: "sku-2", IdemKey: forged}).Error
	wantDuplicate(t, err, "orders", "idx_idem_key", forged)
}

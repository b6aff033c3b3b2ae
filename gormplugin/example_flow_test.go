package gormplugin_test

import (
	"errors"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"gorm.io/gorm"
)

// TestExample_BuyFlow runs the Example's buy against MariaDB.
func TestExample_BuyFlow(t *testing.T) {
	t.Parallel()
	db, _ := openWith(t, withFoundRows(t, testenv.MySQL(t)), gormplugin.New(), &gorm.Config{})
	if err := db.AutoMigrate(&Item{}, &Purchase{}); err != nil {
		t.Fatal(err)
	}
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
	// The lock passes to a newer holder, then the old one writes late.
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

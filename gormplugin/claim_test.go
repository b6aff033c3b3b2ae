package gormplugin_test

import (
	"errors"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
)

func TestClaim_PutsTheReadAmongFencedWrites(t *testing.T) {
	db, log := open(t)
	p := seed(t, db, "sku-1", 10, 5)
	log.take()

	// Holder 7 claims, then reads: the older holder 6 can no longer write.
	if err := gormplugin.Claim(db.WithContext(at(7)), &Product{ID: p.ID}); err != nil {
		t.Fatal(err)
	}
	wantRow(t, db, p.ID, 10, 7)
	err := db.WithContext(at(6)).Model(&Product{ID: p.ID}).Update("stock", 9).Error
	wantStale(t, err, "products", "id=1", 6, 7)

	// Claiming again with the same token is fine; an older claim is stale.
	if err := gormplugin.Claim(db.WithContext(at(7)), &Product{ID: p.ID}); err != nil {
		t.Fatalf("re-claim at the same token: %v", err)
	}
	if err := gormplugin.Claim(db.WithContext(at(6)), &Product{ID: p.ID}); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("older claim: %v, want ErrStale", err)
	}
	wantRow(t, db, p.ID, 10, 7)
}

func TestClaim_RefusesWithoutTokenOrFence(t *testing.T) {
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 5)
	if err := gormplugin.Claim(db, &Product{ID: p.ID}); !errors.Is(err, gormplugin.ErrNoToken) {
		t.Fatalf("claim without a token: %v", err)
	}
	if err := gormplugin.Claim(db.WithContext(at(9)), &Ledger{ID: 1}); !errors.Is(err, gormplugin.ErrNoFence) {
		t.Fatalf("claim of a model without a fence: %v", err)
	}
}

func TestClaim_ByBusinessKey(t *testing.T) {
	db, _ := open(t)
	p := seed(t, db, "sku-1", 10, 5)
	other := seed(t, db, "sku-2", 10, 5)

	// By conditions, the way the row is looked up everywhere else.
	if err := gormplugin.Claim(db.WithContext(at(7)).Where("sku = ?", "sku-1"), &Product{}); err != nil {
		t.Fatalf("Claim(db.Where(sku), &Product{}): %v", err)
	}
	wantRow(t, db, p.ID, 10, 7)
	wantRow(t, db, other.ID, 10, 5)
	// By a model with only its unique key set.
	if err := gormplugin.Claim(db.WithContext(at(8)), &Product{SKU: "sku-1"}); err != nil {
		t.Fatalf("Claim(&Product{SKU: ...}): %v", err)
	}
	wantRow(t, db, p.ID, 10, 8)
	wantRow(t, db, other.ID, 10, 5)
	// An older holder's claim by key is stale, and changes nothing.
	if err := gormplugin.Claim(db.WithContext(at(6)), &Product{SKU: "sku-1"}); !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("older claim by key: %v, want ErrStale", err)
	}
	wantRow(t, db, p.ID, 10, 8)
	// A model with neither its key nor conditions names no row: refused,
	// never a claim of the whole table.
	if err := gormplugin.Claim(db.WithContext(at(9)), &Product{Stock: 10}); !errors.Is(err, gormplugin.ErrNoRow) {
		t.Fatalf("claim naming no row: %v, want ErrNoRow", err)
	}
	wantRow(t, db, p.ID, 10, 8)
	wantRow(t, db, other.ID, 10, 5)
}

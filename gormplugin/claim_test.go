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

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/gormplugin"
)

// Product is a SKU on sale. Its fence column records the fencing token of
// the newest lock holder that wrote the row, so that the database refuses a
// write of an older holder (one whose lock expired while it paused).
type Product struct {
	SKU   string           `gorm:"primaryKey;size:64" json:"sku"`
	Name  string           `gorm:"size:255;not null;default:''" json:"name"`
	Stock int              `gorm:"not null" json:"stock"`
	Price int64            `gorm:"not null;default:0" json:"price"` // in the currency's smallest unit (cents)
	Fence gormplugin.Fence `json:"-"`
}

// Order is one unit of a SKU bought by one user. The unique index on
// (user_id, sku) allows one unit per user and SKU; the unique index on
// idempotency_key stores the request's idempotency record
// (guard.IdempotencyRecord), so that a retry whose Redis record was lost
// still cannot create a second order; idempotency_fingerprint stores the
// identity of the request that created the order
// (guard.IdempotencyFingerprint), so that the key sent again for another
// purchase is refused rather than answered with this order.
type Order struct {
	ID             uint64           `gorm:"primaryKey" json:"id"`
	UserID         string           `gorm:"size:64;not null;uniqueIndex:idx_orders_user_sku" json:"user_id"`
	SKU            string           `gorm:"size:64;not null;uniqueIndex:idx_orders_user_sku" json:"sku"`
	IdempotencyKey *string          `gorm:"size:64;uniqueIndex:idx_orders_idempotency_key" json:"-"`
	IdempotencyFP  *string          `gorm:"column:idempotency_fingerprint;size:64" json:"-"`
	Fence          gormplugin.Fence `json:"-"`
	CreatedAt      time.Time        `json:"created_at"`
}

// The unique indexes of Order, as gormplugin.DuplicateError names them.
const (
	indexUserSKU        = "idx_orders_user_sku"
	indexIdempotencyKey = "idx_orders_idempotency_key"
)

// The demo product an empty database starts with.
const (
	demoSKU   = "sku-1"
	demoStock = 100
)

// migrate creates the tables and indexes, and gives an empty database the
// demo product.
func migrate(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	if err := db.AutoMigrate(&Product{}, &Order{}); err != nil {
		return fmt.Errorf("create the schema: %w", err)
	}
	var n int64
	if err := db.Model(&Product{}).Count(&n).Error; err != nil {
		return fmt.Errorf("count products: %w", err)
	}
	if n > 0 {
		return nil
	}
	err := db.Create(&Product{SKU: demoSKU, Name: "Flash-sale demo item", Stock: demoStock, Price: 9900}).Error
	if errors.Is(err, gormplugin.ErrDuplicate) {
		return nil // another instance seeded it first
	}
	return err
}

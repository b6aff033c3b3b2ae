package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// Item is a SKU on sale; its fence column records the newest lock holder
// that wrote it.
type Item struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence // BIGINT NOT NULL DEFAULT 0: the newest token that wrote the row
}

// Purchase may exist once per user and SKU, and once per idempotency key.
type Purchase struct {
	ID      uint
	UserID  uint   `gorm:"uniqueIndex:idx_user_sku"`
	SKU     string `gorm:"size:64;uniqueIndex:idx_user_sku"`
	IdemKey string `gorm:"size:64;uniqueIndex:idx_idem_key"`
}

var errSoldOut = errors.New("sold out")

// buy takes one unit of sku for a user, under the lock whose context is ctx.
// Both writes run in one transaction: if either is refused, neither happens.
func buy(ctx context.Context, db *gorm.DB, userID uint, sku, idemKey string) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// UPDATE items SET stock = stock - 1, fence = <token>
		// WHERE sku = ? AND stock > 0 AND fence <= <token>
		res := tx.Model(&Item{}).Where("sku = ? AND stock > 0", sku).Update("stock", gorm.Expr("stock - 1"))
		if res.Error != nil {
			return res.Error // fencing.ErrStale when a newer holder got there first
		}
		if res.RowsAffected == 0 {
			return errSoldOut
		}
		return tx.Create(&Purchase{UserID: userID, SKU: sku, IdemKey: idemKey}).Error
	})
}

// Example shows the path from a lock to a fenced write: the lock's context
// carries its fencing token, db.WithContext hands it to the plugin, and the
// database refuses the write if a newer holder of the lock has written the
// row since. It also tells the two unique indexes of Purchase apart.
//
// It needs a MySQL or MariaDB server, so it is compiled but not run;
// TestExample_BuyFlow runs buy against a real database.
func Example() {
	db, err := gorm.Open(mysql.Open("root@tcp(127.0.0.1:3306)/shop?parseTime=true&clientFoundRows=true"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(gormplugin.New()); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Item{}, &Purchase{}); err != nil {
		log.Fatal(err)
	}

	// In a service the context comes from the lock,
	//	ctx, err := locks.Mutex("sku:sku-42").Lock(c.Request.Context())
	// and is cancelled with lock.ErrLost if the lock is lost. Here a
	// token stands in for it.
	ctx := fencing.WithToken(context.Background(), 1_718_000_000_000_001)

	err = buy(ctx, db, 7, "sku-42", "3f2a-idem")
	var dup *gormplugin.DuplicateError
	switch {
	case err == nil:
		fmt.Println("ordered")
	case errors.Is(err, fencing.ErrStale):
		fmt.Println("lock lost, nothing written:", err) // answer 409: guard.AbortStale(c, err) in a Gin handler
	case errors.As(err, &dup) && dup.Index == "idx_user_sku":
		fmt.Println("this user already bought this SKU")
	case errors.As(err, &dup) && dup.Index == "idx_idem_key":
		fmt.Println("idempotency key used before")
	case errors.Is(err, errSoldOut):
		fmt.Println("sold out")
	default:
		log.Fatal(err)
	}
}

package gormplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
)

// The backstop in ten lines: a fence column in the model, the plugin on the
// database, the lock's context on the write. A holder whose token is older
// than the row's fence (it lost its lock, and a newer holder wrote the row)
// is refused by the database itself.
func Example_fence() {
	type Product struct {
		ID    uint
		SKU   string `gorm:"size:64;uniqueIndex"`
		Stock int
		Fence gormplugin.Fence // BIGINT NOT NULL DEFAULT 0: the newest token that wrote the row
	}
	db := openExampleDB(&Product{}) // SQLite in memory here; MySQL and MariaDB alike
	db.Use(gormplugin.New())        // fences every write whose context carries a token
	db.Create(&Product{SKU: "sku-42", Stock: 10})

	// UPDATE products SET stock=stock-1, fence=<token> WHERE sku=? AND fence<=<token>
	sell := func(ctx context.Context) error { // ctx: the lock's, c.Request.Context()
		return db.WithContext(ctx).Model(&Product{}).Where("sku = ?", "sku-42").
			Update("stock", gorm.Expr("stock - 1")).Error
	}
	fmt.Println(sell(fencing.WithToken(context.Background(), 200))) // the newer holder
	err := sell(fencing.WithToken(context.Background(), 100))       // one that lost its lock
	fmt.Println(errors.Is(err, fencing.ErrStale))
	// Output:
	// <nil>
	// true
}

// openExampleDB opens an SQLite database in memory (pure Go) and creates the
// tables of models.
func openExampleDB(models ...any) *gorm.DB {
	db, err := gorm.Open(sqlite.Open("file:/example-fence?vfs=memdb"), &gorm.Config{Logger: logger.Discard})
	if err == nil {
		err = db.AutoMigrate(models...)
	}
	if err != nil {
		log.Fatal(err)
	}
	return db
}

package guard_test

import (
	"errors"
	"log"
	"net/http"
	"os"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
)

// shopItem and shopOrder are the tables of the combining example.
type shopItem struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

type shopOrder struct {
	ID   uint
	User string `gorm:"size:64;uniqueIndex:idx_user_sku"`
	SKU  string `gorm:"size:64;uniqueIndex:idx_user_sku"`
}

// A hot SKU: the purchases of one instance that arrive while one of them
// holds the SKU's lock wait behind it, and the holder runs them in one
// transaction with one commit, each in a savepoint of its own. The handler
// is written for one request; a repeat buyer's part is rolled back alone
// while the rest of the batch buys.
//
// It needs a MySQL or MariaDB server, so it is compiled but not run;
// TestCombine_BatchMixingNewBuyersRepeatBuyersAndCancelledRequests runs the
// same purchase against a real database.
func Example_combining() {
	db, err := gorm.Open(mysql.Open(os.Getenv("MYSQL_DSN")), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	db.Use(gormplugin.New())
	g := guard.New(redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")}))
	defer g.Close()

	r := gin.New()
	r.POST("/api/seckill/:sku", g.Lock("sku:<sku>", guard.Combining(gormplugin.Batch(db))), func(c *gin.Context) {
		// The batch's transaction: fenced with the lock's token, committed
		// once for the whole batch; this request's part began at a savepoint.
		tx, _ := gormplugin.Tx(c)
		res := tx.Model(&shopItem{}).Where("sku = ? AND stock > 0", c.Param("sku")).Update("stock", gorm.Expr("stock - 1"))
		switch {
		case errors.Is(res.Error, fencing.ErrStale):
			// The batch lost its lock: every request of it is answered 409,
			// and none is stored for replay.
			guard.AbortStale(c, res.Error)
			return
		case res.Error != nil:
			_ = c.Error(res.Error)
			c.AbortWithStatus(http.StatusInternalServerError)
			return
		case res.RowsAffected == 0:
			c.JSON(http.StatusConflict, gin.H{"error": "sold_out"})
			return
		}
		err := tx.Create(&shopOrder{User: c.GetHeader("X-User-ID"), SKU: c.Param("sku")}).Error
		if errors.Is(err, gormplugin.ErrDuplicate) {
			// A 4xx answer rolls this request's part back, the unit included.
			c.JSON(http.StatusConflict, gin.H{"error": "already_purchased"})
			return
		}
		c.JSON(http.StatusCreated, gin.H{"sku": c.Param("sku")})
	})
	_ = http.ListenAndServe("127.0.0.1:8080", r)
}

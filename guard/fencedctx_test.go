package guard_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// item is a fenced row.
type item struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

func TestLock_DBWithGinContextIsFencedWhateverContextWithFallback(t *testing.T) {
	srv := testenv.Redis(t)
	db, err := gorm.Open(mysql.Open(testenv.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormplugin.New(gormplugin.Strict())); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&item{}); err != nil {
		t.Fatal(err)
	}
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextWithFallback=%v", fallback), func(t *testing.T) {
			sku := fmt.Sprintf("sku-%v", fallback)
			// Strict refuses a token-less write to the model: seed with SQL.
			if err := db.Exec("INSERT INTO items (sku, stock, fence) VALUES (?, 10, 0)", sku).Error; err != nil {
				t.Fatal(err)
			}
			var token fencing.Token
			in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
				r.ContextWithFallback = fallback
				r.POST("/buy/:sku", g.Lock("sku:<sku>"), func(c *gin.Context) {
					token, _ = guard.Token(c)
					// The Gin idiom: the *gin.Context itself as the context.
					err := db.WithContext(c).Model(&item{}).Where("sku = ?", c.Param("sku")).
						Update("stock", gorm.Expr("stock - 1")).Error
					if err != nil {
						c.String(500, err.Error())
						return
					}
					c.Status(200)
				})
			})
			if r := do(t, "POST", in.srv.URL+"/buy/"+sku, ""); r.status != 200 {
				t.Fatalf("buy: %d %s", r.status, r.body)
			}
			var row item
			if err := db.Where("sku = ?", sku).Take(&row).Error; err != nil {
				t.Fatal(err)
			}
			if !token.Valid() || row.Fence.Token() != token || row.Stock != 9 {
				t.Fatalf("row %+v after a write under token %d: want stock 9 and fence %d", row, token, token)
			}
		})
	}
}

func TestLock_DBWithGinContextIsRefusedOnceTheLockIsLost(t *testing.T) {
	srv := testenv.Redis(t)
	db, err := gorm.Open(mysql.Open(testenv.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Use(gormplugin.New()); err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&item{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("INSERT INTO items (sku, stock, fence) VALUES ('s', 10, 0)").Error; err != nil {
		t.Fatal(err)
	}
	var werr error
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		// ContextWithFallback false: c itself never ends, the lock's
		// context does.
		r.POST("/buy/:sku", g.Lock("sku:<sku>", guard.Lease(50*time.Millisecond)), func(c *gin.Context) {
			<-c.Request.Context().Done() // the lease runs out: the lock is lost
			werr = db.WithContext(c).Model(&item{}).Where("sku = ?", "s").Update("stock", gorm.Expr("stock - 1")).Error
		})
	})
	do(t, "POST", in.srv.URL+"/buy/s", "")
	var row item
	if err := db.Where("sku = ?", "s").Take(&row).Error; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, fencing.ErrStale) || row.Stock != 10 || row.Fence != 0 {
		t.Fatalf("write after the loss: %v, row %+v; want ErrStale and the row untouched", werr, row)
	}
}

// With ContextWithFallback a *gin.Context is a context whose Done and Err
// read c.Request, and code that watches it from a goroutine of its own
// reads c.Request when the context it found there ends. A guard step sets
// c.Request back once the handler is done, before it ends the context it
// had put there (the lock's, a combining turn's, the idempotency key's), so
// that such a reader, woken by that end, reads c.Request after the write:
// the race detector sees the two otherwise (a combining turn ended its
// context first). That is all a step can order: a step outside it sets
// c.Request back after the inner one's context ended (Idempotent outside
// Lock), a batch's lock ends with the batch, and gin sets c.Request again
// for the Context's next request; hence db.WithContext(c.Request.Context()),
// never db.WithContext(c) (see Lock).
func TestSteps_SetTheRequestBackBeforeItsContextEnds(t *testing.T) {
	srv := testenv.Redis(t)
	db := openOrdDB(t)
	probe := func(c *gin.Context) {
		done := c.Done() // the context the step put into c.Request
		read := make(chan struct{})
		go func() {
			<-done
			_ = c.Err() // reads c.Request, as database/sql's watchers do
			close(read)
		}()
		c.Set("probe", read)
		c.Status(http.StatusCreated)
	}
	// waitProbe lets the request go only once the probe has read, so that
	// gin's next use of the pooled Context is not what the detector sees.
	waitProbe := func(c *gin.Context) {
		c.Next()
		if v, ok := c.Get("probe"); ok {
			select {
			case <-v.(chan struct{}):
			case <-time.After(10 * time.Second):
				t.Error("the context the handler ran with did not end with its request")
			}
		}
	}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.ContextWithFallback = true
		r.Use(waitProbe)
		r.POST("/lock/:sku", g.Lock("probe:<sku>"), probe)
		r.POST("/combine/:sku", g.Lock("probe:<sku>", guard.Combining(gormplugin.Batch(db))), probe)
		r.POST("/idem/:sku", g.Idempotent(guard.Unscoped()), probe)
		r.POST("/lock-idem/:sku", g.Lock("probe:<sku>"), g.Idempotent(guard.Unscoped()), probe)
		r.POST("/combine-idem/:sku", g.Lock("probe:<sku>", guard.Combining(gormplugin.Batch(db))), g.Idempotent(guard.Unscoped()), probe)
		r.POST("/wait/:sku", g.Idempotent(guard.Unscoped(), guard.WaitForFirst(time.Second)), probe)
	})
	for i, path := range []string{"/lock/", "/combine/", "/idem/", "/lock-idem/", "/combine-idem/", "/wait/"} {
		if r := do(t, "POST", in.srv.URL+path+"1", "", "Idempotency-Key", fmt.Sprintf("probe-%d", i)); r.status != http.StatusCreated {
			t.Errorf("%s: %d %s", path, r.status, r.body)
		}
	}
}

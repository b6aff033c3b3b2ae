package guard_test

// The code of docs/GUIDE.md, "Guard a purchase route in six calls", and the
// tests that run it: two instances of the guide's service on one Redis and
// one MariaDB. The guide quotes the regions between "// guide:begin NAME"
// and "// guide:end NAME" word for word; docs/snippets_test.go holds it to
// them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// guide:begin model

// Product is a SKU on sale. Its fence column holds the fencing token of the
// newest lock holder that wrote the row: BIGINT NOT NULL DEFAULT 0.
type Product struct {
	ID    uint
	SKU   string `gorm:"size:64;uniqueIndex"`
	Stock int
	Fence gormplugin.Fence
}

// Order is one unit of a SKU bought by one user: the unique index allows one
// per user and SKU, so a double click cannot make two.
type Order struct {
	ID     uint
	UserID string `gorm:"size:64;uniqueIndex:idx_user_sku"`
	SKU    string `gorm:"size:64;uniqueIndex:idx_user_sku"`
}

// guide:end model

// guide:begin setup

// newShop wires one instance of the service: a Guard on Redis, the plugin
// on the database, one guarded route. Each instance has its own rdb and db
// (its own connection pools); they share the servers.
func newShop(ctx context.Context, rdb redis.UniversalClient, db *gorm.DB) (*gin.Engine, *guard.Guard, error) {
	g := guard.New(rdb, guard.WithNamespace("shop")) // 1. one Guard per process
	if err := g.Ping(ctx); err != nil {              // 2. a wrong address fails the boot
		g.Close()
		return nil, nil, err
	}
	if err := db.Use(gormplugin.New()); err != nil { // 3. fenced writes, named unique indexes
		g.Close()
		return nil, nil, err
	}
	r := gin.New()
	r.POST("/api/seckill/:sku", g.Lock("sku:<sku>"), buy(db)) // 4. one lock per SKU
	return r, g, nil
}

// guide:end setup

// guide:begin handler

var errSoldOut = errors.New("sold out")

// buy sells one unit of the SKU to the user named by X-User-ID: read the
// stock, check it, write it back, create the order, in one transaction.
func buy(db *gorm.DB) gin.HandlerFunc {
	return func(c *gin.Context) {
		user, sku := c.GetHeader("X-User-ID"), c.Param("sku")
		if user == "" {
			c.JSON(http.StatusBadRequest, gin.H{"error": "user_required"})
			return
		}
		// 5. The request's context holds the lock: its token fences every
		// write, and it is cancelled if the lock is lost.
		err := db.WithContext(c.Request.Context()).Transaction(func(tx *gorm.DB) error {
			var p Product
			// SELECT ... FOR UPDATE: the read takes its place among the fenced writes.
			err := tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).
				Where("sku = ?", sku).Take(&p).Error
			if err != nil {
				return err
			}
			if p.Stock <= 0 {
				return errSoldOut
			}
			// UPDATE products SET stock=?, fence=<token> WHERE id=? AND fence<=<token>
			if err := tx.Model(&p).Update("stock", p.Stock-1).Error; err != nil {
				return err
			}
			return tx.Create(&Order{UserID: user, SKU: sku}).Error
		})
		switch {
		case err == nil:
			c.JSON(http.StatusCreated, gin.H{"sku": sku, "user": user})
		case errors.Is(err, errSoldOut):
			c.JSON(http.StatusConflict, gin.H{"error": "sold_out"})
		case errors.Is(err, gormplugin.ErrDuplicate): // idx_user_sku: the unit goes back
			c.JSON(http.StatusConflict, gin.H{"error": "already_purchased"})
		case errors.Is(err, gorm.ErrRecordNotFound):
			c.JSON(http.StatusNotFound, gin.H{"error": "not_found"})
		case errors.Is(err, fencing.ErrStale), guard.Lost(c.Request.Context()):
			guard.AbortStale(c, err) // 6. 409: the lock was lost, nothing was written
		default:
			_ = c.Error(err)
			c.AbortWithStatus(http.StatusInternalServerError)
		}
	}
}

// guide:end handler

// openShopDB opens the database of dsn for one instance of the guide's
// service, with clientFoundRows as gormplugin recommends, and creates the
// guide's tables (AutoMigrate, or the migration tool of the service).
func openShopDB(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	cfg, err := mysqldriver.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.AutoMigrate(&Product{}, &Order{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return db
}

// guide:begin instance

// shopInstance starts one instance of the guide's service, with its own
// Redis client and database pool, and returns its URL and Guard.
func shopInstance(t *testing.T, rdb *redis.Client, dsn string) (string, *guard.Guard) {
	t.Helper()
	r, g, err := newShop(context.Background(), rdb, openShopDB(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL, g
}

// purchase sends one purchase and returns its answer: "201", "409 sold_out", ...
func purchase(t *testing.T, url, user string) string {
	req, _ := http.NewRequest("POST", url, nil)
	req.Header.Set("X-User-ID", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return err.Error()
	}
	defer resp.Body.Close()
	var body struct{ Error string }
	json.NewDecoder(resp.Body).Decode(&body)
	return strings.TrimSpace(fmt.Sprint(resp.StatusCode, " ", body.Error))
}

// guide:end instance

// TestGuide_TwoInstancesSellTheStockExactlyOnce runs the guide's route on two
// instances, as docs/GUIDE.md says to test it: 120 buyers, a fifth of them
// clicking twice, round robin over both, on 100 units. Exactly 100 orders,
// none twice for a user, stock 0, and no answer but the guide's.
func TestGuide_TwoInstancesSellTheStockExactlyOnce(t *testing.T) {
	redisAddr, dsn := testenv.Redis(t).Addr, testenv.MySQL(t)
	// guide:begin test
	a, _ := shopInstance(t, redis.NewClient(&redis.Options{Addr: redisAddr}), dsn)
	b, _ := shopInstance(t, redis.NewClient(&redis.Options{Addr: redisAddr}), dsn)
	db := openShopDB(t, dsn)
	db.Create(&Product{SKU: "sku-1", Stock: 100})

	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	for i := range 120 {
		clicks := 1 + i%5/4 // every fifth buyer clicks twice
		for range clicks {
			wg.Go(func() {
				url := []string{a, b}[i%2] + "/api/seckill/sku-1"
				answer := purchase(t, url, fmt.Sprint("u", i))
				for answer == "429 busy" { // the lock stayed busy for 2s: ask again
					answer = purchase(t, url, fmt.Sprint("u", i))
				}
				mu.Lock()
				answers[answer]++
				mu.Unlock()
			})
		}
	}
	wg.Wait()

	var orders, buyers int64
	var p Product
	db.Model(&Order{}).Count(&orders)
	db.Model(&Order{}).Distinct("user_id").Count(&buyers)
	db.Where("sku = ?", "sku-1").Take(&p)
	if orders != 100 || buyers != 100 || p.Stock != 0 || answers["201"] != 100 {
		t.Errorf("orders %d, buyers %d, stock left %d, answers %v", orders, buyers, p.Stock, answers)
	}
	// guide:end test
	for a, n := range answers {
		if a != "201" && a != "409 sold_out" && a != "409 already_purchased" {
			t.Errorf("%d answers %q, which the guide does not promise (all: %v)", n, a, answers)
		}
	}
	if n := answers["201"] + answers["409 sold_out"] + answers["409 already_purchased"]; n != 144 {
		t.Errorf("%d of 144 clicks answered 201 or 409: %v", n, answers)
	}
}

// TestGuide_EachAnswerAsTheGuideSaysIt: each answer of the guide's table,
// from two instances of its service on one Redis and one MariaDB.
func TestGuide_EachAnswerAsTheGuideSaysIt(t *testing.T) {
	redisServer, dsn := testenv.Redis(t), testenv.MySQL(t)
	a, _ := shopInstance(t, redisServer.Client(), dsn)
	b, gb := shopInstance(t, redisServer.Client(), dsn)
	db := openShopDB(t, dsn)
	if err := db.Use(gormplugin.New()); err != nil { // the test writes as a lock holder too
		t.Fatal(err)
	}
	db.Create(&Product{SKU: "sku-2", Stock: 2})
	db.Create(&Product{SKU: "sku-3", Stock: 5})
	want := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}

	want("a purchase", purchase(t, a+"/api/seckill/sku-2", "u1"), "201")
	want("the same user again, on the other instance", purchase(t, b+"/api/seckill/sku-2", "u1"), "409 already_purchased")
	want("another user: the unit came back", purchase(t, b+"/api/seckill/sku-2", "u2"), "201")
	want("the stock is gone", purchase(t, a+"/api/seckill/sku-2", "u3"), "409 sold_out")
	want("no user", purchase(t, a+"/api/seckill/sku-2", ""), "400 user_required")
	want("a SKU that does not exist", purchase(t, a+"/api/seckill/sku-9", "u1"), "404 not_found")

	// 429: the lock of sku-3 is held elsewhere (here by instance b's lock
	// Client) for longer than the wait, 2s by default.
	ctx := context.Background()
	m := gb.Locks().Mutex("sku:sku-3")
	held, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	want("the lock held elsewhere", purchase(t, a+"/api/seckill/sku-3", "u1"), "429 busy")
	if waited := time.Since(start); waited < 2*time.Second {
		t.Errorf("busy after %v, want the whole 2s wait", waited)
	}
	m.Unlock(held)

	// 409 stale_write: instance a's request holds the lock and loses it
	// (force-unlocked, as "seckillguard force-unlock" does) while it waits for
	// the row; a newer holder takes the lock and writes the row with its
	// token. The database refuses a's late write, and nothing of it remains.
	newerWriter := db.Begin()
	defer newerWriter.Rollback()
	newerWriter.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).Where("sku = ?", "sku-3").Take(&Product{})
	late := make(chan string, 1)
	go func() { late <- purchase(t, a+"/api/seckill/sku-3", "u1") }()
	rdb := redisServer.Client()
	for deadline := time.Now().Add(10 * time.Second); rdb.Exists(ctx, "shop:sku:sku-3").Val() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("instance a's request never took the lock of sku-3")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rdb.Del(ctx, "shop:sku:sku-3")
	newer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := newerWriter.WithContext(newer).Model(&Product{}).Where("sku = ?", "sku-3").Update("stock", 4).Error; err != nil {
		t.Fatal(err)
	}
	if err := newerWriter.Commit().Error; err != nil {
		t.Fatal(err)
	}
	want("a late write of a lost lock", <-late, "409 stale_write")
	m.Unlock(newer)
	var p Product
	var orders int64
	db.Where("sku = ?", "sku-3").Take(&p)
	db.Model(&Order{}).Where("sku = ?", "sku-3").Count(&orders)
	if p.Stock != 4 || orders != 0 {
		t.Errorf("after the refused write: stock %d, %d orders; want the newer holder's 4 and none", p.Stock, orders)
	}

	// 503: Redis is down. A running instance answers lock_unavailable; a new
	// one does not start (Ping).
	down := testenv.Redis(t)
	c, _ := shopInstance(t, down.Client(), dsn)
	down.Kill()
	want("Redis down", purchase(t, c+"/api/seckill/sku-3", "u1"), "503 lock_unavailable")
	if _, _, err := newShop(ctx, down.Client(), openShopDB(t, dsn)); err == nil {
		t.Error("newShop started with Redis down: want Ping's error")
	}
}

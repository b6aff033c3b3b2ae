package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/gormplugin"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/lock"
)

// A small flash-sale service written the usual way, for the scenarios
// whose Redis the reference service cannot reach (it takes REDIS_URL, a
// single node): read the stock, check it, deduct it in the application
// (stock = read - 1), create the order, under guard's lock on the SKU, with
// both writes fenced by the lock's token in one transaction.

type shopProduct struct {
	SKU   string `gorm:"primaryKey;size:64"`
	Stock int
	Fence gormplugin.Fence
}

type shopOrder struct {
	ID     uint64
	UserID string `gorm:"size:64;uniqueIndex:idx_shop_user_sku"`
	SKU    string `gorm:"size:64;uniqueIndex:idx_shop_user_sku"`
	Fence  gormplugin.Fence
}

// shopPolicies lock a purchase on its SKU.
const shopPolicies = `
routes:
  - route: POST /api/seckill/:sku
    lock: "sku:<sku>"
    wait: 2s
`

// seedShop creates the tables and one product of stock units.
func seedShop(t testing.TB, dsn, sku string, stock int) *gorm.DB {
	t.Helper()
	db, err := faults.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	if err := db.AutoMigrate(&shopProduct{}, &shopOrder{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&shopProduct{SKU: sku, Stock: stock}).Error; err != nil {
		t.Fatal(err)
	}
	return db
}

// shopInstance is one instance of the service: its own Redis client, Guard,
// database pool and HTTP server.
type shopInstance struct {
	url   string
	guard *guard.Guard
	stale atomic.Int64 // purchases refused by the backstop
	told  atomic.Int64 // purchases whose lock context said lost while they ran
	fence atomic.Int64 // purchase writes refused by the fence (a newer token on the row)

	// rec, when set, records each purchase's hold and write, the stock
	// being the register (see record).
	rec atomic.Pointer[history.Recorder]
	seq atomic.Int64

	stalls sync.Map // user -> *stall: that user's purchase stalls between its read and its write
}

// A stall holds one buyer's purchase between its read and its write until
// the test releases it, as a pause of unknown length would.
type stall struct {
	reached chan struct{} // closed once the purchase has read and stalls
	release chan struct{} // close to let it write
	ctx     context.Context
	// toldBeforeWrite says whether the purchase's lock context had ended
	// when it sent its write (set before release's answer is sent).
	toldBeforeWrite atomic.Bool
}

// stall makes user's next purchase on in stall; close the result's release
// to let it go on.
func (in *shopInstance) stall(user string) *stall {
	st := &stall{reached: make(chan struct{}), release: make(chan struct{})}
	in.stalls.Store(user, st)
	return st
}

// checkShop runs the history checker on the shop's recorded purchases of
// sku: the stock is the register, initially initial, and the product row
// holds its final value and fence.
func checkShop(t testing.TB, rec *history.Recorder, db *gorm.DB, sku string, initial int, opts ...history.Option) history.Report {
	t.Helper()
	return checkShopSKUs(t, rec, db, map[string]int{sku: initial}, opts...)
}

// checkShopSKUs is checkShop for several SKUs, each with its initial stock.
func checkShopSKUs(t testing.TB, rec *history.Recorder, db *gorm.DB, initial map[string]int, opts ...history.Option) history.Report {
	t.Helper()
	fences, final := make(map[string]int64), make(map[string]int64)
	for sku, n := range initial {
		var p shopProduct
		if err := db.Take(&p, "sku = ?", sku).Error; err != nil {
			t.Fatal(err)
		}
		key := "sku:" + sku
		rec.Initial(key, int64(n))
		fences[key], final[key] = int64(p.Fence.Token()), int64(p.Stock)
	}
	opts = append([]history.Option{history.Fences(fences)}, opts...)
	return history.Check(rec.History(), final, opts...)
}

func startShop(t testing.TB, rdb redis.UniversalClient, dsn string, watchdog, holdDelay time.Duration) *shopInstance {
	t.Helper()
	db, err := faults.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	pol, err := guard.ParsePolicies("shop.yaml", []byte(shopPolicies))
	if err != nil {
		t.Fatal(err)
	}
	in := &shopInstance{guard: guard.New(rdb, guard.WithLogger(quiet), guard.WithLockOptions(lock.WithWatchdogTimeout(watchdog)))}
	t.Cleanup(func() { in.guard.Close() })
	r := gin.New()
	r.Use(in.guard.Policies(pol))
	r.POST("/api/seckill/:sku", func(c *gin.Context) { in.buy(c, db, holdDelay) })
	hs := httptest.NewServer(r)
	t.Cleanup(hs.Close)
	in.url = hs.URL
	return in
}

func (in *shopInstance) buy(c *gin.Context, db *gorm.DB, holdDelay time.Duration) {
	ctx := c.Request.Context()
	sku, user := c.Param("sku"), c.GetHeader("X-User-ID")
	var s *section
	if rec := in.rec.Load(); rec != nil {
		s = enter(rec, fmt.Sprintf("%s#%d:%s", in.url, in.seq.Add(1), user), "sku:"+sku, ctx)
		defer s.Leave()
	}
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), lock.ErrLost) {
			in.told.Add(1)
		}
	})
	defer stop()
	readAt := history.Now()
	var p shopProduct
	if err := db.WithContext(ctx).Take(&p, "sku = ?", sku).Error; err != nil {
		in.fail(c, err)
		return
	}
	if p.Stock <= 0 {
		ginmw.Abort(c, http.StatusConflict, "sold_out")
		return
	}
	if d, err := time.ParseDuration(c.GetHeader("X-Hold")); err == nil {
		holdDelay = d // this purchase stalls longer, as a GC pause would
	}
	time.Sleep(holdDelay) // a pause between the read and the write
	if v, ok := in.stalls.LoadAndDelete(user); ok {
		st := v.(*stall)
		st.ctx = ctx
		close(st.reached)
		<-st.release
		st.toldBeforeWrite.Store(ctx.Err() != nil)
	}
	start := history.Now()
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&shopProduct{SKU: sku}).Update("stock", p.Stock-1)
		if res.Error != nil {
			return res.Error
		}
		return tx.Create(&shopOrder{UserID: user, SKU: sku}).Error
	})
	if s != nil {
		w := history.Write{Key: s.hold.Key, Owner: s.hold.Owner, Token: s.hold.Token,
			Read: int64(p.Stock), ReadAt: readAt, Value: int64(p.Stock - 1), Start: start, End: history.Now(), Accepted: err == nil}
		if err != nil {
			w.Err = err.Error()
		}
		s.rec.AddWrite(w)
	}
	var se *fencing.StaleError
	if errors.As(err, &se) && se.Current.Valid() {
		in.fence.Add(1)
	}
	switch {
	case err == nil:
		c.JSON(http.StatusCreated, gin.H{"user": user})
	case errors.Is(err, gormplugin.ErrDuplicate):
		ginmw.Abort(c, http.StatusConflict, "already_purchased")
	default:
		in.fail(c, err)
	}
}

func (in *shopInstance) fail(c *gin.Context, err error) {
	if errors.Is(err, fencing.ErrStale) || guard.Lost(c.Request.Context()) {
		in.stale.Add(1)
		_ = c.Error(err) // the lock middleware answers 409
		return
	}
	ginmw.Abort(c, http.StatusInternalServerError, "internal", ginmw.Extra("detail", err.Error()))
}

// saleResult is what a sale's buyers were answered.
type saleResult struct {
	mu       sync.Mutex
	statuses map[string]int // "201", "409 sold_out", "503", "transport", ...
	ordered  []string       // users answered 201
	attempts atomic.Int64
}

func (r *saleResult) count(what string) {
	r.mu.Lock()
	r.statuses[what]++
	r.mu.Unlock()
}

// sell has buyers users buy sku once each, through the instances in turn,
// with workers buyers at a time. A buyer retries (up to 60 times, 50ms
// apart) while the answer is busy, unavailable, stale or a transport
// error, as a client would; it stops at 201 or a final 409.
func sell(t testing.TB, instances []string, sku string, buyers, workers int, onProgress func(done int)) *saleResult {
	t.Helper()
	res := &saleResult{statuses: make(map[string]int)}
	client := &http.Client{Timeout: 10 * time.Second}
	users := make(chan int)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range users {
				user := fmt.Sprintf("u%04d", u)
				for try := range 60 {
					res.attempts.Add(1)
					base := instances[(u+try)%len(instances)]
					req, _ := http.NewRequest(http.MethodPost, base+"/api/seckill/"+sku, nil)
					req.Header.Set("X-User-ID", user)
					resp, err := client.Do(req)
					if err != nil {
						res.count("transport")
						time.Sleep(50 * time.Millisecond)
						continue
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					code := errorCode(body)
					res.count(fmt.Sprintf("%d %s", resp.StatusCode, code))
					if resp.StatusCode == http.StatusCreated {
						res.mu.Lock()
						res.ordered = append(res.ordered, user)
						res.mu.Unlock()
						break
					}
					if resp.StatusCode == http.StatusConflict && (code == "sold_out" || code == "already_purchased") {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if onProgress != nil {
					onProgress(int(done.Add(1)))
				}
			}
		}()
	}
	for u := range buyers {
		users <- u
	}
	close(users)
	wg.Wait()
	return res
}

func errorCode(body []byte) string {
	var v struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(body, &v)
	return v.Error
}

// checkSale fails t if the database shows an oversold or duplicated sale of
// the shop: see checkSaleIn.
func checkSale(t testing.TB, db *gorm.DB, sku string, initial int, res *saleResult) (orders int) {
	t.Helper()
	return checkSaleIn(t, db, "shop_products", "shop_orders", sku, initial, res)
}

// checkSaleIn fails t if the tables show an oversold or duplicated sale:
// more orders than stock, a stock below zero, a unit sold without its
// decrement (orders + stock != initial), a user with two orders, or orders
// other than those the buyers were answered 201 for. It returns the number
// of orders.
func checkSaleIn(t testing.TB, db *gorm.DB, products, orders, sku string, initial int, res *saleResult) int {
	t.Helper()
	var stock, n int
	if err := db.Raw("SELECT stock FROM "+products+" WHERE sku = ?", sku).Scan(&stock).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Raw("SELECT COUNT(*) FROM "+orders+" WHERE sku = ?", sku).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	var dups []string
	if err := db.Raw("SELECT user_id FROM "+orders+" WHERE sku = ? GROUP BY user_id HAVING COUNT(*) > 1", sku).Scan(&dups).Error; err != nil {
		t.Fatal(err)
	}
	if stock < 0 || n > initial || n+stock != initial || len(dups) > 0 {
		t.Errorf("oversold or duplicated: initial stock %d, stock now %d, %d orders, users with two orders %v", initial, stock, n, dups)
	}
	var users []string
	if err := db.Raw("SELECT user_id FROM "+orders+" WHERE sku = ? ORDER BY user_id", sku).Scan(&users).Error; err != nil {
		t.Fatal(err)
	}
	told := append([]string(nil), res.ordered...)
	sort.Strings(told)
	if !slices.Equal(users, told) {
		t.Errorf("orders in the database and buyers answered 201 differ: %d orders, %d answers", len(users), len(told))
	}
	return n
}

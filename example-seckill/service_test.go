package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
)

// TestService_ThreeInstancesSellExactlyTheStock is the promise of the
// framework on real servers: three instances on one Redis and one MariaDB,
// 2,000 buyers (a quarter of them clicking twice) after 100 units.
func TestService_ThreeInstancesSellExactlyTheStock(t *testing.T) {
	t.Parallel()
	b, _ := realServers(t)
	cfg := testConfig(t, ModeGuard)
	cfg.HoldDelay, cfg.HoldRate = 2*time.Millisecond, 0.5 // widen the read-to-write window
	ins, db := cluster(t, b, cfg, 3)
	const sku, stock = "sku-three", 100
	putProduct(t, ins[0], sku, stock)

	// Watch the stock from outside while the sale runs: it only goes down,
	// one unit at a time, and never below zero.
	var watchErr atomic.Value
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		prev := stock
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var p Product
			if err := db.Where("sku = ?", sku).Take(&p).Error; err != nil {
				continue
			}
			if p.Stock < 0 || p.Stock > prev {
				watchErr.Store("stock went from " + strconv.Itoa(prev) + " to " + strconv.Itoa(p.Stock))
				return
			}
			prev = p.Stock
		}
	}()

	urls := []string{ins[0].url, ins[1].url, ins[2].url}
	s := &sale{
		urls: urls, sku: sku, buyers: 2000, repeat: 0.25, concurrency: 48,
		deadline: time.Now().Add(45 * time.Second), keyPrefix: "three",
		client: newClient(48), progress: newProgressBar(io.Discard, "three"),
	}
	res := s.run(context.Background())
	t.Logf("sale: %d requests in %v: %s", res.requests, res.elapsed, formatAnswers(res.answers))
	close(stop)
	<-watched
	if v := watchErr.Load(); v != nil {
		t.Error(v)
	}

	if res.unsent > 0 {
		t.Errorf("%d clicks not sent before the deadline", res.unsent)
	}
	for answer, n := range res.answers {
		if answer == "transport error" || strings.HasPrefix(answer, "5") {
			t.Errorf("%d answers %q", n, answer)
		}
	}
	if res.answers["201"] < stock {
		t.Errorf("%d answers 201, want at least %d (one per order; replays repeat them)", res.answers["201"], stock)
	}

	orders := ordersOf(t, db, sku)
	users := make(map[string]bool)
	for _, o := range orders {
		if users[o.UserID] {
			t.Errorf("user %s has two orders", o.UserID)
		}
		users[o.UserID] = true
	}
	if len(orders) != stock {
		t.Errorf("%d orders, want exactly %d", len(orders), stock)
	}
	if left := stockOf(t, db, sku); left != 0 {
		t.Errorf("stock left %d, want 0", left)
	}

	// The buyers come back without idempotency keys: nobody buys twice.
	for i, o := range orders[:20] {
		if a := buyAt(t, ins[i%3], sku, o.UserID, ""); a.status == http.StatusCreated {
			t.Errorf("user %s bought again: %v", o.UserID, a)
		}
	}
	if n := len(ordersOf(t, db, sku)); n != stock {
		t.Errorf("%d orders after the repeats, want %d", n, stock)
	}
}

func TestService_IdempotentRetryGetsTheFirstOrder(t *testing.T) {
	t.Parallel()
	ins, db := cluster(t, embedded(t), testConfig(t, ModeGuard), 2)
	putProduct(t, ins[0], "sku-idem", 5)

	first := buyAt(t, ins[0], "sku-idem", "u1", "k1")
	if first.status != http.StatusCreated {
		t.Fatalf("first purchase: %v", first)
	}
	retry := buyAt(t, ins[1], "sku-idem", "u1", "k1")
	if retry.status != http.StatusCreated || retry.header.Get(guard.ReplayedHeader) != "true" || retry.order(t).ID != first.order(t).ID {
		t.Fatalf("retry on another instance: %v (replayed %q), want the first order %v replayed", retry, retry.header.Get(guard.ReplayedHeader), first)
	}
	if a := buyAt(t, ins[1], "sku-idem", "u1", "k2"); a.status != http.StatusConflict || a.code() != "already_purchased" {
		t.Errorf("same buyer, new key: %v, want 409 already_purchased", a)
	}
	// Keys are the buyer's own: another buyer's k1 is another purchase.
	if a := buyAt(t, ins[0], "sku-idem", "u2", "k1"); a.status != http.StatusCreated || a.order(t).UserID != "u2" {
		t.Errorf("another buyer with the same key: %v, want their own order", a)
	}
	if left := stockOf(t, db, "sku-idem"); left != 3 {
		t.Errorf("stock %d, want 3", left)
	}
}

// TestService_LostIdempotencyRecordIsCaughtByTheDatabase: when the Redis
// record of a completed purchase is gone (expired, flushed, a failover),
// the unique idempotency_key column still refuses a second order, and the
// retry gets the first one.
func TestService_LostIdempotencyRecordIsCaughtByTheDatabase(t *testing.T) {
	t.Parallel()
	b := embedded(t)
	ins, db := cluster(t, b, testConfig(t, ModeGuard), 2)
	putProduct(t, ins[0], "sku-flush", 5)
	first := buyAt(t, ins[0], "sku-flush", "u1", "k1")
	if first.status != http.StatusCreated {
		t.Fatalf("first purchase: %v", first)
	}
	b.mini.FlushAll()

	retry := buyAt(t, ins[1], "sku-flush", "u1", "k1")
	if retry.status != http.StatusCreated || retry.order(t).ID != first.order(t).ID || retry.header.Get(guard.ReplayedHeader) != "true" {
		t.Fatalf("retry after the record was lost: %v, want the first order %v", retry, first)
	}
	if left, n := stockOf(t, db, "sku-flush"), len(ordersOf(t, db, "sku-flush")); left != 4 || n != 1 {
		t.Errorf("stock %d and %d orders, want 4 and 1: the retry's deduction must be rolled back", left, n)
	}
}

func TestService_SoldOutIsAnsweredWithoutTheLock(t *testing.T) {
	t.Parallel()
	ins, _ := cluster(t, embedded(t), testConfig(t, ModeGuard), 1)
	in := ins[0]
	putProduct(t, in, "sku-gone", 1)
	if a := buyAt(t, in, "sku-gone", "u1", "k1"); a.status != http.StatusCreated {
		t.Fatalf("last unit: %v", a)
	}
	// Another instance holds the SKU's lock, for longer than the 2s wait.
	locks := lock.New(in.rdb)
	defer locks.Close()
	m := locks.Mutex("sku:sku-gone")
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(held)
	// The instance saw the stock reach 0 when it sold the last unit; its
	// memory of that lasts soldOutFor, renewed here so that a slow run
	// cannot outlast it.
	in.svc.soldOut.mark("sku-gone")

	start := time.Now()
	if a := buyAt(t, in, "sku-gone", "u2", ""); a.status != http.StatusConflict || a.code() != "sold_out" {
		t.Errorf("after the sale: %v, want 409 sold_out", a)
	}
	if a := buyAt(t, in, "sku-gone", "u3", "k3"); a.status != http.StatusConflict || a.code() != "sold_out" {
		t.Errorf("after the sale, with a key: %v, want 409 sold_out", a)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("sold_out took %v: it waited for the lock", d)
	}
	// The retry of the buyer who got the last unit is replayed, not sold_out.
	if a := buyAt(t, in, "sku-gone", "u1", "k1"); a.status != http.StatusCreated || a.header.Get(guard.ReplayedHeader) != "true" {
		t.Errorf("retry of the last purchase: %v, want its order replayed", a)
	}
	if n := counter(in, "seckill_sold_out_fast_total", "", ""); n != 2 {
		t.Errorf("seckill_sold_out_fast_total = %v, want 2", n)
	}
}

// TestService_LostLeaseRefusesTheWrite: with a lease shorter than the pause
// between the read and the write, the lock is lost before the write, and
// the write is refused; nothing is sold.
func TestService_LostLeaseRefusesTheWrite(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, ModeGuardLease)
	cfg.Lease, cfg.HoldDelay = 80*time.Millisecond, 300*time.Millisecond
	ins, db := cluster(t, embedded(t), cfg, 1)
	in := ins[0]
	putProduct(t, in, "sku-lease", 10)

	a := buyAt(t, in, "sku-lease", "u1", "")
	if a.status != http.StatusConflict || (a.code() != "stale_write" && a.code() != "lock_lost") {
		t.Fatalf("purchase that outlived its lease: %v, want 409 stale_write or lock_lost", a)
	}
	if left, n := stockOf(t, db, "sku-lease"), len(ordersOf(t, db, "sku-lease")); left != 10 || n != 0 {
		t.Errorf("stock %d and %d orders, want 10 and none", left, n)
	}
	if n := counter(in, "seckill_stale_writes_refused_total", "by", refusedLockLost); n != 1 {
		t.Errorf("refused lock_lost = %v, want 1", n)
	}
	if n := counter(in, "seckillguard_lock_lost_total", "", ""); n != 1 {
		t.Errorf("seckillguard_lock_lost_total = %v, want 1", n)
	}
}

// TestService_WatchdogKeepsALongHold: without a fixed lease the watchdog
// renews the lock through a pause three times its timeout.
func TestService_WatchdogKeepsALongHold(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, ModeGuard)
	cfg.Watchdog, cfg.HoldDelay = 300*time.Millisecond, 900*time.Millisecond
	ins, db := cluster(t, embedded(t), cfg, 1)
	putProduct(t, ins[0], "sku-dog", 10)
	if a := buyAt(t, ins[0], "sku-dog", "u1", ""); a.status != http.StatusCreated {
		t.Fatalf("purchase: %v", a)
	}
	if left := stockOf(t, db, "sku-dog"); left != 9 {
		t.Errorf("stock %d, want 9", left)
	}
	if n := counter(ins[0], "seckillguard_lock_lost_total", "", ""); n != 0 {
		t.Errorf("seckillguard_lock_lost_total = %v, want 0", n)
	}
}

// TestService_FenceRefusesAnOlderToken: a row written by a newer token (a
// holder the lock was handed to) refuses the write of an older one in the
// database, and the instance counts it as a fence refusal.
func TestService_FenceRefusesAnOlderToken(t *testing.T) {
	t.Parallel()
	b, _ := realServers(t)
	ins, db := cluster(t, b, testConfig(t, ModeGuard), 1)
	putProduct(t, ins[0], "sku-fence", 10)
	// Tokens are Redis TIME in microseconds; this one is from the future.
	if err := db.Model(&Product{}).Where("sku = ?", "sku-fence").UpdateColumn("fence", int64(1)<<60).Error; err != nil {
		t.Fatal(err)
	}
	a := buyAt(t, ins[0], "sku-fence", "u1", "")
	if a.status != http.StatusConflict || a.code() != "stale_write" {
		t.Fatalf("purchase with an older token: %v, want 409 stale_write", a)
	}
	if left, n := stockOf(t, db, "sku-fence"), len(ordersOf(t, db, "sku-fence")); left != 10 || n != 0 {
		t.Errorf("stock %d and %d orders, want 10 and none", left, n)
	}
	if n := counter(ins[0], "seckill_stale_writes_refused_total", "by", refusedFence); n != 1 {
		t.Errorf("refused by the fence = %v, want 1", n)
	}
}

func TestService_AdminCreatesAndResetsProducts(t *testing.T) {
	t.Parallel()
	ins, db := cluster(t, embedded(t), testConfig(t, ModeGuard), 1)
	url := ins[0].url + "/api/admin/products"
	if a := do(t, http.MethodPost, url, `{"sku":"sku-a","name":"A","stock":2,"price":150}`); a.status != http.StatusCreated {
		t.Fatalf("create: %v", a)
	}
	if a := buyAt(t, ins[0], "sku-a", "u1", ""); a.status != http.StatusCreated {
		t.Fatalf("buy: %v", a)
	}
	a := do(t, http.MethodGet, ins[0].url+"/api/products/sku-a", "")
	if a.status != http.StatusOK || !strings.Contains(string(a.body), `"stock":1`) || !strings.Contains(string(a.body), `"price":150`) {
		t.Errorf("product: %v", a)
	}
	if a := do(t, http.MethodPost, url, `{"sku":"sku-a","name":"A2","stock":7,"price":99}`); a.status != http.StatusOK {
		t.Fatalf("reset: %v", a)
	}
	if left, n := stockOf(t, db, "sku-a"), len(ordersOf(t, db, "sku-a")); left != 7 || n != 0 {
		t.Errorf("after the reset: stock %d and %d orders, want 7 and none", left, n)
	}
	if a := buyAt(t, ins[0], "sku-a", "u1", ""); a.status != http.StatusCreated {
		t.Errorf("buy after the reset: %v", a)
	}

	// Refused by the lock's key template (no usable sku) or by the handler.
	for _, body := range []string{
		`{"sku":"","stock":1}`,
		`{"sku":"a b","stock":1}`,
		`{"sku":"sku-b"}`,
		`{"sku":"sku-b","stock":-1}`,
		`{"sku":"sku-b","stock":1,"price":-5}`,
		`not json`,
	} {
		if a := do(t, http.MethodPost, url, body); a.status != http.StatusBadRequest {
			t.Errorf("%s: %v, want 400", body, a)
		}
	}
	if a := do(t, http.MethodGet, ins[0].url+"/api/products/none", ""); a.status != http.StatusNotFound || a.code() != "not_found" {
		t.Errorf("unknown product: %v", a)
	}
	if a := buyAt(t, ins[0], "none", "u1", ""); a.status != http.StatusNotFound {
		t.Errorf("buy of an unknown product: %v", a)
	}
}

func TestService_PurchaseNeedsABuyer(t *testing.T) {
	t.Parallel()
	ins, _ := cluster(t, embedded(t), testConfig(t, ModeGuard), 1)
	if a := do(t, http.MethodPost, ins[0].url+"/api/seckill/"+demoSKU, ""); a.status != http.StatusBadRequest || a.code() != "user_required" {
		t.Errorf("no X-User-ID: %v", a)
	}
	if a := buyAt(t, ins[0], demoSKU, "u{1}", ""); a.status != http.StatusBadRequest || a.code() != "bad_user_id" {
		t.Errorf("bad X-User-ID: %v", a)
	}
	if a := buyAt(t, ins[0], demoSKU, "u1", ""); a.status != http.StatusCreated {
		t.Errorf("the demo product: %v", a)
	}
}

func TestNewService_RefusesPoliciesThatLeaveThePurchaseUnlocked(t *testing.T) {
	t.Parallel()
	b := embedded(t)
	rdb := b.NewRedis()
	defer rdb.Close()
	db, err := b.OpenDB()
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB(db)
	for _, tc := range []struct{ name, yaml, want string }{
		{"no purchase route", "routes:\n  - route: POST /api/admin/products\n    lock: \"sku:<body:sku>\"\n", "no entry for POST /api/seckill/:sku"},
		{"unknown route", "routes:\n  - route: POST /api/seckill/:sku\n    lock: \"sku:<sku>\"\n  - route: POST /api/orders\n    lock: \"x\"\n", "does not have"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := guard.ParsePolicies(tc.name, []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, ModeGuard)
			cfg.Policies = pol
			if _, err := NewService(cfg, rdb, db); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// Creations of new SKUs at once insert into the same gap of the products'
// unique index; on MariaDB they deadlock now and then, and the database
// rolls back a victim. Every creation must still succeed, without the lock
// and with it (guard: each creation holds its SKU's lock and writes with its
// token), and a second round on the same SKUs resets them all.
func TestService_ConcurrentCreationsOfNewProductsAllSucceed(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeNone, ModeGuard} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b, _ := realServers(t)
			ins, db := cluster(t, b, testConfig(t, mode), 1)
			url := ins[0].url + "/api/admin/products"
			const creators, each = 32, 8
			for round, want := range []int{http.StatusCreated, http.StatusOK} {
				var wg sync.WaitGroup
				failed := make(chan string, creators*each)
				for g := range creators {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range each {
							body := fmt.Sprintf(`{"sku":"new-%d-%d","name":"N","stock":%d,"price":1}`, g, i, 3+round)
							if a := do(t, http.MethodPost, url, body); a.status != want {
								failed <- fmt.Sprintf("%s: %v, want %d", body, a, want)
							}
						}
					}()
				}
				wg.Wait()
				close(failed)
				n := 0
				for f := range failed {
					if n++; n <= 3 {
						t.Error(f)
					}
				}
				if n > 0 {
					t.Fatalf("round %d: %d of %d creations failed", round+1, n, creators*each)
				}
				var count int64
				if err := db.Model(&Product{}).Where("sku LIKE ? AND stock = ?", "new-%", 3+round).Count(&count).Error; err != nil || count != creators*each {
					t.Fatalf("round %d: %d products with stock %d in the database (%v), want %d", round+1, count, 3+round, err, creators*each)
				}
			}
		})
	}
}

// TestService_KeyReusedOnAnotherSKUIs422: an Idempotency-Key names one
// purchase; sent again for another SKU it is refused, by the Redis record
// and, once that is lost, by the order's stored identity — never answered
// with the first SKU's order, and nothing is bought. On MariaDB.
func TestService_KeyReusedOnAnotherSKUIs422(t *testing.T) {
	t.Parallel()
	b, rs := realServers(t)
	ins, db := cluster(t, b, testConfig(t, ModeGuard), 2)
	putProduct(t, ins[0], "sku-a", 5)
	putProduct(t, ins[0], "sku-b", 5)
	first := buyAt(t, ins[0], "sku-a", "u1", "k1")
	if first.status != http.StatusCreated {
		t.Fatalf("first purchase: %v", first)
	}
	check := func(when string) {
		t.Helper()
		if a := buyAt(t, ins[1], "sku-b", "u1", "k1"); a.status != http.StatusUnprocessableEntity || a.code() != "idempotency_key_reused" {
			t.Errorf("%s: sku-a's key on sku-b: %v, want 422 idempotency_key_reused", when, a)
		}
		if left, n := stockOf(t, db, "sku-b"), len(ordersOf(t, db, "sku-b")); left != 5 || n != 0 {
			t.Errorf("%s: sku-b has stock %d and %d orders, want 5 and 0", when, left, n)
		}
	}
	check("with the Redis record")

	ctx := context.Background()
	rdb := rs.Client()
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, "seckillguard:idem:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("idempotency keys %v, %v", keys, err)
	}
	rdb.Del(ctx, keys...) // the record is lost: the database is the backstop
	check("with the record lost")
	if a := buyAt(t, ins[1], "sku-a", "u1", "k1"); a.status != http.StatusCreated || a.order(t).ID != first.order(t).ID {
		t.Errorf("the key's own retry after the loss: %v, want the first order %v", a, first)
	}
	if a := buyAt(t, ins[0], "sku-b", "u1", "k1"); a.status != http.StatusUnprocessableEntity {
		t.Errorf("sku-b again after the retry: %v, want 422", a)
	}
	if left, n := stockOf(t, db, "sku-a"), len(ordersOf(t, db, "sku-a")); left != 4 || n != 1 {
		t.Errorf("sku-a has stock %d and %d orders, want 4 and 1", left, n)
	}
}

func TestService_UnknownOrSoldOutSKUNeverReachesTheLock(t *testing.T) {
	t.Parallel()
	b, _ := realServers(t)
	ins, _ := cluster(t, b, testConfig(t, ModeGuard), 1)
	in := ins[0]
	putProduct(t, in, "sku-real", 3)
	putProduct(t, in, "sku-empty", 0)
	ctx := context.Background()
	before, err := in.rdb.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf("k-%d", i)
		}
		if a := buyAt(t, in, fmt.Sprintf("made-up-%d", i), fmt.Sprintf("u%d", i), key); a.status != http.StatusNotFound || a.code() != "not_found" {
			t.Fatalf("made-up SKU: %v, want 404 not_found", a)
		}
	}
	// A SKU whose stock is 0 is answered without the lock too, although
	// this instance never saw it sell out.
	if a := buyAt(t, in, "sku-empty", "u1", "k-empty"); a.status != http.StatusConflict || a.code() != "sold_out" {
		t.Fatalf("sold-out SKU: %v, want 409 sold_out", a)
	}
	after, _ := in.rdb.DBSize(ctx).Result()
	if after != before {
		keys, _ := in.rdb.Keys(ctx, "*").Result()
		t.Fatalf("%d Redis keys before the made-up SKUs, %d after: %.200v", before, after, keys)
	}
	if a := buyAt(t, in, "sku-real", "u1", "k-real"); a.status != http.StatusCreated {
		t.Fatalf("a real SKU: %v, want 201", a)
	}
}

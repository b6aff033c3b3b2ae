package reliability

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// failoverShops starts three instances of the shop on Sentinel failover
// clients of env.
func failoverShops(t *testing.T, env *testenv.SentinelEnv, dsn string, watchdog time.Duration) ([]*shopInstance, []string) {
	t.Helper()
	var urls []string
	var shops []*shopInstance
	for range 3 {
		// Commands retry for about as long as a failover takes, so that
		// a release sent as the master dies still arrives: a lock whose
		// final Unlock fails stays renewed by its Client's watchdog (see
		// docs/RELIABILITY.md).
		rdb := env.FailoverClient(func(o *redis.FailoverOptions) {
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 300*time.Millisecond, time.Second, time.Second
			o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff = 40, 20*time.Millisecond, 200*time.Millisecond
		})
		in := startShop(t, rdb, dsn, watchdog, 10*time.Millisecond)
		shops = append(shops, in)
		urls = append(urls, in.url)
	}
	return shops, urls
}

// A lock lost in a failover (Redis replicates asynchronously, so the lock a
// master granted may never reach its replica): a buyer takes the lock on
// the master, the master dies before its replica has the lock, the replica
// is promoted without it, and a second buyer gets the same lock while the
// first is still inside, stalled between its read and its write. The first
// buyer is told it lost the lock and its writes are refused: one unit, one
// order.
func TestFailover_LockMissingOnThePromotedReplicaIsFencedOff(t *testing.T) {
	const sku = "sku-ghost"
	env := testenv.Sentinel(t)
	dsn := testenv.MySQL(t)
	db := seedShop(t, dsn, sku, 10)
	shops, urls := failoverShops(t, env, dsn, time.Second)
	client := &http.Client{Timeout: 30 * time.Second}
	buy := func(url, user, hold string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, url+"/api/seckill/"+sku, nil)
		req.Header.Set("X-User-ID", user)
		if hold != "" {
			req.Header.Set("X-Hold", hold)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, errorCode(body)
	}

	rec := history.NewRecorder()
	for _, in := range shops {
		in.rec.Store(rec)
	}

	// The replica stops hearing from the master: frozen, its link cut.
	env.Replica.Pause()
	env.Master.Do("CLIENT", "KILL", "TYPE", "replica")
	type answer struct {
		status int
		code   string
	}
	first := make(chan answer, 1)
	go func() {
		s, c := buy(urls[0], "slow", "4s")
		first <- answer{s, c}
	}()
	lockKey := "sku:" + sku
	eventually(t, 5*time.Second, "the first buyer holding the lock on the master", func() bool {
		return env.Master.Do("EXISTS", lockKey) == int64(1)
	})
	env.Master.Kill()
	env.Replica.Resume()
	env.WaitForFailover(30 * time.Second)
	if env.Replica.Do("EXISTS", lockKey) != int64(0) {
		t.Fatal("the promoted replica has the lock: the ghost-lock scenario did not happen")
	}

	status, code := buy(urls[1], "fast", "")
	if status != http.StatusCreated {
		t.Fatalf("the second buyer on the promoted replica: %d %s, want 201", status, code)
	}
	if len(first) != 0 {
		t.Fatal("the first buyer was done before the second got in: the two holds did not overlap")
	}
	a := <-first
	if a.status != http.StatusConflict || (a.code != "stale_write" && a.code != "lock_lost") {
		t.Fatalf("the first buyer, whose lock the failover lost: %d %s, want 409 stale_write or lock_lost", a.status, a.code)
	}
	res := &saleResult{ordered: []string{"fast"}}
	if orders := checkSale(t, db, sku, 10, res); orders != 1 {
		t.Fatalf("%d orders, want the second buyer's only", orders)
	}
	if shops[0].stale.Load() != 1 {
		t.Fatalf("instance 0 counted %d refused writes, want 1", shops[0].stale.Load())
	}
	// The first buyer was told, while it was inside, that its lock was lost;
	// the second's token is newer; the history is clean.
	if n := shops[0].told.Load(); n != 1 {
		t.Errorf("instance 0 saw %d purchases told of a lost lock, want the first buyer's", n)
	}
	r := checkShop(t, rec, db, sku, 10)
	t.Logf("the first buyer was answered %d %s; the second bought the unit; %s", a.status, a.code, r)
	var slow, fast *history.Hold
	h := rec.History()
	for i, x := range h.Holds {
		switch {
		case strings.HasSuffix(x.Owner, ":slow"):
			slow = &h.Holds[i]
		case strings.HasSuffix(x.Owner, ":fast"):
			fast = &h.Holds[i]
		}
	}
	if slow == nil || fast == nil {
		t.Fatalf("holds not recorded: %+v", h.Holds)
	}
	if !slow.Lost() {
		t.Errorf("the first buyer's hold (token %d) was never told of its loss before it left", slow.Token)
	}
	if fast.Token <= slow.Token {
		t.Errorf("the second buyer's token %d is not above the first's %d across the failover", fast.Token, slow.Token)
	}
	if !r.OK() {
		t.Errorf("history: %s", r)
	}
}

// The master killed under Sentinel during a sale: three instances on
// Sentinel failover clients keep selling through the failover, and the
// database shows no unit sold twice, no order duplicated and no order
// without its decrement. Requests that meet the failover are answered 503
// (fail closed) and retried by their clients.
func TestFailover_MasterKilledMidSaleOversellsNothing(t *testing.T) {
	const (
		sku     = "sku-failover"
		stock   = 60
		buyers  = 150
		workers = 12
	)
	env := testenv.Sentinel(t)
	dsn := testenv.MySQL(t)
	db := seedShop(t, dsn, sku, stock)
	shops, urls := failoverShops(t, env, dsn, 2*time.Second)

	var once sync.Once
	killed := make(chan time.Time, 1)
	start := time.Now()
	res := sell(t, urls, sku, buyers, workers, func(done int) {
		if done == buyers/5 {
			once.Do(func() {
				env.Master.Kill()
				killed <- time.Now()
			})
		}
	})
	var killedAt time.Time
	select {
	case killedAt = <-killed:
	default:
		t.Fatal("the sale ended before the master was killed")
	}
	env.WaitForFailover(30 * time.Second)
	orders := checkSale(t, db, sku, stock, res)
	var stale int64
	for _, in := range shops {
		stale += in.stale.Load()
	}
	t.Logf("master killed %v into the sale; %d orders of %d units in %v, %d requests, %d refused by the backstop; answers %v",
		killedAt.Sub(start).Round(time.Millisecond), orders, stock, time.Since(start).Round(time.Millisecond), res.attempts.Load(), stale, res.statuses)
	if orders != stock {
		t.Errorf("%d orders for %d units and %d buyers: the sale did not go on after the failover", orders, stock, buyers)
	}
}

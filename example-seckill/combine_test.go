package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// combinedSale is what the buyers of a combining sale saw.
type combinedSale struct {
	mu      sync.Mutex
	answers map[string]int
	bought  []string // users answered 201
}

// sellCombined has buyers users buy sku through the instances, workers at
// a time; every third user clicks twice at once, without an
// Idempotency-Key, so that one of the two clicks is a repeat buyer's (the
// unique index answers it already_purchased) — often in the same batch as
// the first. A click answered busy, lock_lost, stale_write or batch_failed
// is sent again, as a client would.
func sellCombined(t *testing.T, urls []string, sku string, buyers, workers int) *combinedSale {
	t.Helper()
	res := &combinedSale{answers: map[string]int{}}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	clicks := make(chan string, buyers*2)
	for i := range buyers {
		u := fmt.Sprintf("u%04d", i)
		clicks <- u
		if i%3 == 0 {
			clicks <- u
		}
	}
	close(clicks)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for u := range clicks {
				for try := 0; ; try++ {
					req, _ := http.NewRequest(http.MethodPost, urls[rand.IntN(len(urls))]+"/api/seckill/"+sku, nil)
					req.Header.Set("X-User-ID", u)
					resp, err := client.Do(req)
					what := "transport"
					if err == nil {
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						what = answer{status: resp.StatusCode, body: body}.summary()
					}
					res.mu.Lock()
					res.answers[what]++
					if what == "201" {
						res.bought = append(res.bought, u)
					}
					res.mu.Unlock()
					switch {
					case what == "429 busy", what == "409 lock_lost", what == "409 stale_write", what == "transport",
						what[0] == '5' && what != "500 internal":
						if try < 100 {
							time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
							continue
						}
					}
					break
				}
			}
		})
	}
	wg.Wait()
	return res
}

// summary is "201" or "409 sold_out".
func (a answer) summary() string {
	if a.status == http.StatusCreated {
		return "201"
	}
	return fmt.Sprintf("%d %s", a.status, a.code())
}

// checkExact checks what the database holds after a sale of initial units
// of sku: orders = initial - stock left, no unit oversold, one order per
// buyer, and exactly the buyers answered 201 hold an order.
func checkExact(t *testing.T, db *gorm.DB, sku string, initial int, res *combinedSale) int {
	t.Helper()
	left := stockOf(t, db, sku)
	orders := ordersOf(t, db, sku)
	users := make([]string, 0, len(orders))
	for _, o := range orders {
		users = append(users, o.UserID)
	}
	sort.Strings(users)
	if left < 0 || len(orders) > initial || len(orders) != initial-left {
		t.Errorf("initial stock %d, stock left %d, %d orders: want orders = initial - left, none oversold", initial, left, len(orders))
	}
	if c := slices.Compact(slices.Clone(users)); len(c) != len(users) {
		t.Errorf("%d orders for %d buyers: a buyer has two", len(users), len(c))
	}
	told := slices.Clone(res.bought)
	sort.Strings(told)
	if !slices.Equal(users, told) {
		t.Errorf("%d orders in the database, %d purchases answered 201: every 201 must be an order and every order a 201", len(users), len(told))
	}
	return len(orders)
}

// combinedCount sums a counter over the instances.
func combinedCount(ins []*instance, name string) float64 {
	sum := 0.0
	for _, in := range ins {
		sum += counter(in, name, "", "")
	}
	return sum
}

func TestCombine_ThreeInstancesSellOneSKUExactly(t *testing.T) {
	b, _ := realServers(t)
	pol := builtinPolicies(t)
	for _, tc := range []struct {
		name     string
		policies *guard.Policies
		delay    time.Duration // the pause inside the critical section
		rate     float64       // of the purchases
		lost     bool          // locks must be lost
	}{
		{name: "no faults", policies: pol},
		// A lease shorter than a pause some purchases make inside the
		// batch: batches lose their lock mid-way, and their writes must
		// all be refused while the other instances sell on.
		{name: "lost leases mid-batch", policies: mustWith(t, pol, guard.Lease(60*time.Millisecond)), delay: 90 * time.Millisecond, rate: 0.05, lost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, ModeGuardCombine)
			cfg.Policies, cfg.HoldDelay, cfg.HoldRate = tc.policies, tc.delay, max(tc.rate, 1e-9)
			if tc.delay == 0 {
				cfg.HoldRate = 1
			}
			cfg.Logger = quietLogger()
			ins, db := cluster(t, b, cfg, 3)
			sku := "combine-" + tc.name[:2]
			const initial, buyers = 150, 240
			putProduct(t, ins[0], sku, initial)
			res := sellCombined(t, urlsOf(ins), sku, buyers, 48)
			n := checkExact(t, db, sku, initial, res)
			if counted := combinedCount(ins, "seckill_orders_total"); counted != float64(n) {
				t.Errorf("the instances counted %v orders, the database holds %d: an order counted before its batch committed", counted, n)
			}
			combined, lost := combinedCount(ins, "seckillguard_combined_requests_total"), combinedCount(ins, "seckillguard_lock_lost_total")
			t.Logf("%d orders of %d units; %v requests combined into others' batches; %v locks lost; answers %v", n, initial, combined, lost, res.answers)
			if n != initial {
				t.Errorf("%d orders for %d units and %d buyers: the sale stopped short", n, initial, buyers)
			}
			if combined == 0 {
				t.Error("no request ran in another's batch: the sale did not combine")
			}
			// Turns go round the instances: every one of them took the
			// lock for batches of its own.
			for i, in := range ins {
				if n := counter(in, "seckillguard_lock_acquired_total", "", ""); n < 2 {
					t.Errorf("instance %d took the lock %v times: the turns did not go round", i, n)
				}
			}
			if tc.lost && lost == 0 {
				t.Error("no lock was lost: the fault did not happen")
			}
		})
	}
}

func TestCombine_AnInstanceWhoseRedisStallsSellsNothingTwice(t *testing.T) {
	// One instance's connection to Redis stops delivering (a paused link:
	// the instance stays up, its database link too) for longer than its
	// watchdog timeout, in the middle of the sale, while one of its batches
	// runs: that batch's hold is lost while it runs, and the other two
	// sell on.
	rs, dsn := testenv.Redis(t), testenv.MySQL(t)
	proxy, err := faults.NewProxy(rs.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	b, bv := backendsOn(t, "redis://"+rs.Addr, dsn), backendsOn(t, "redis://"+proxy.Addr, dsn)
	cfg := testConfig(t, ModeGuardCombine)
	cfg.Watchdog, cfg.Logger = 600*time.Millisecond, quietLogger()
	cfg.HoldDelay, cfg.HoldRate = 5*time.Millisecond, 0.2
	ins, db := cluster(t, b, cfg, 2)
	victim, err := startInstance(context.Background(), bv, cfg, "127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.stop)
	all := append(ins, victim)
	const sku, initial, buyers = "combine-stall", 150, 240
	putProduct(t, ins[0], sku, initial)
	// The link stalls from inside a batch of the victim, right after a
	// purchase read the stock under the lock, and the batch goes on only
	// once the victim's lock Client has found the hold lost (its renewals
	// cannot get through), as a batch caught in a GC pause would. A stall
	// timed from the test's start instead found the victim holding nothing
	// when the machine was loaded (its requests not yet in), and lost no
	// hold.
	const stall = 1500 * time.Millisecond
	var once sync.Once
	stalled := make(chan struct{})
	hook := func() {
		once.Do(func() {
			proxy.SetBlackhole(true)
			start := time.Now()
			go func() {
				defer close(stalled)
				time.Sleep(stall)
				proxy.SetBlackhole(false)
			}()
			for counter(victim, "seckillguard_lock_events_total", "event", "lost") == 0 && time.Since(start) < stall {
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	victim.svc.afterRead.Store(&hook)
	res := sellCombined(t, urlsOf(all), sku, buyers, 48)
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("no purchase of the victim read the stock under its lock: the link never stalled")
	}
	n := checkExact(t, db, sku, initial, res)
	lost := counter(victim, "seckillguard_lock_lost_total", "", "")
	t.Logf("%d orders of %d units; the stalled instance lost %v locks; answers %v", n, initial, lost, res.answers)
	if lost == 0 {
		t.Error("the stalled instance lost no lock: the fault did not happen")
	}
	if n != initial {
		t.Errorf("%d orders for %d units and %d buyers: the sale stopped short", n, initial, buyers)
	}
}

// backendsOn returns backends on the Redis and the database named.
func backendsOn(t *testing.T, redisURL, dsn string) *Backends {
	t.Helper()
	b, err := OpenBackends(env(map[string]string{envRedisURL: redisURL, envMySQLDSN: dsn}), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	b.Quiet()
	return b
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustWith(t *testing.T, p *guard.Policies, opts ...guard.RouteOption) *guard.Policies {
	t.Helper()
	out, err := p.With(http.MethodPost+" "+routeBuy, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func urlsOf(ins []*instance) []string {
	var out []string
	for _, in := range ins {
		out = append(out, in.url)
	}
	return out
}

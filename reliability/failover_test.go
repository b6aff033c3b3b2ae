package reliability

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// failoverShops starts three instances of the shop on Sentinel failover
// clients of env.
func failoverShops(t *testing.T, env *testenv.SentinelEnv, dsn string, watchdog time.Duration) ([]*shopInstance, []string) {
	t.Helper()
	var urls []string
	var shops []*shopInstance
	for range 3 {
		in := failoverShop(t, env, dsn, watchdog)
		shops = append(shops, in)
		urls = append(urls, in.url)
	}
	return shops, urls
}

// failoverShop starts one instance of the shop on a Sentinel failover
// client of env, its locks renewed with the watchdog timeout watchdog.
func failoverShop(t *testing.T, env *testenv.SentinelEnv, dsn string, watchdog time.Duration) *shopInstance {
	t.Helper()
	// Commands retry for about as long as a failover takes, so that a
	// release sent as the master dies still arrives: a lock whose final
	// Unlock fails stays renewed by its Client's watchdog (see
	// docs/RELIABILITY.md).
	rdb := env.FailoverClient(func(o *redis.FailoverOptions) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 300*time.Millisecond, time.Second, time.Second
		o.MaxRetries, o.MinRetryBackoff, o.MaxRetryBackoff = 40, 20*time.Millisecond, 200*time.Millisecond
	})
	return startShop(t, rdb, dsn, watchdog, 10*time.Millisecond)
}

// buyOnce sends one purchase of sku by user to the shop at url and returns
// its status and error code; hold, when set, is its X-Hold.
func buyOnce(client *http.Client, url, sku, user, hold string) (int, string) {
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

// A lock lost in a failover (Redis replicates asynchronously, so the lock a
// master granted may never reach its replica): a buyer takes the lock on
// the master and stalls between its read and its write, the master dies
// before its replica has the lock, and the replica is promoted without it.
// The first buyer's instance renews every 5 s (watchdog 15 s): its lease
// outlasts the failover, so what tells it is its renewal on the new master
// finding the lock gone — within a renewal period of the failover, long
// before its lease could run out by its own clock. A second buyer then gets
// the same lock while the first is still inside; the first, released,
// writes nothing: one unit, one order, the second's token newer.
func TestFailover_LockMissingOnThePromotedReplicaIsFencedOff(t *testing.T) {
	const (
		sku      = "sku-ghost"
		watchdog = 15 * time.Second
		period   = watchdog / 3
	)
	env := testenv.Sentinel(t)
	dsn := testenv.MySQL(t)
	db := seedShop(t, dsn, sku, 10)
	shops, urls := failoverShops(t, env, dsn, watchdog)
	client := &http.Client{Timeout: 60 * time.Second}
	buy := func(url, user string) (int, string) { return buyOnce(client, url, sku, user, "") }

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
	slowStall := shops[0].stall("slow")
	first := make(chan answer, 1)
	go func() {
		s, c := buy(urls[0], "slow")
		first <- answer{s, c}
	}()
	select {
	case <-slowStall.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the first buyer never read under its lock")
	}
	acquired := time.Now() // the lock was taken a little before
	lockKey := "sku:" + sku
	if env.Master.Do("EXISTS", lockKey) != int64(1) {
		t.Fatal("the first buyer's lock is not on the master")
	}
	env.Master.Kill()
	env.Replica.Resume()
	env.WaitForFailover(30 * time.Second)
	failedOver := time.Now()
	if env.Replica.Do("EXISTS", lockKey) != int64(0) {
		t.Fatal("the promoted replica has the lock: the ghost-lock scenario did not happen")
	}

	// Told by the watchdog within a renewal period (and slack) of the
	// failover: its lease, by its own clock, runs until about 14 s after
	// the acquisition, and renewals answered by the new master never let
	// it run out.
	bound := failedOver.Add(period + 2*time.Second)
	if end := acquired.Add(watchdog - watchdog/20 - time.Second); bound.After(end) {
		t.Fatalf("the failover took %v: a notice by then cannot tell the watchdog's finding from the lease's end", failedOver.Sub(acquired))
	}
	select {
	case <-slowStall.ctx.Done():
	case <-time.After(time.Until(bound)):
		t.Errorf("the first buyer, whose lock the failover lost, was not told within %v of the failover (its lease ends about %v after the acquisition)",
			bound.Sub(failedOver), watchdog)
	}
	toldAfter := time.Since(acquired)
	cause := context.Cause(slowStall.ctx)

	status, code := buy(urls[1], "fast")
	if status != http.StatusCreated {
		t.Fatalf("the second buyer on the promoted replica: %d %s, want 201", status, code)
	}
	if len(first) != 0 {
		t.Fatal("the first buyer was done before the second got in: the two holds did not overlap")
	}
	close(slowStall.release)
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
	if n := shops[0].told.Load(); n != 1 || !errors.Is(cause, lock.ErrLost) || !slowStall.toldBeforeWrite.Load() {
		t.Errorf("instance 0 saw %d purchases told of a lost lock; the first buyer's cause %v: want it told (lock.ErrLost) before its write", n, cause)
	}
	r := checkShop(t, rec, db, sku, 10)
	t.Logf("failover %v after the acquisition; the first buyer told %v after it (%v); answered %d %s; the second bought the unit; %s",
		failedOver.Sub(acquired).Round(time.Millisecond), toldAfter.Round(time.Millisecond), cause, a.status, a.code, r)
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

// The master killed under Sentinel during a sale, with the protections
// provably at work. Asynchronous replication loses what the master granted
// last: the replica is frozen and its link cut, two buyers take the locks of
// two SKUs on the master and stall between their read and their write, and
// the master is killed; the replica is promoted without either lock, while
// a sale of a third SKU goes on through the failover, on two instances of
// its own that renew every 667 ms (watchdog 2 s).
//
//   - Instance 1 renews every 40 s (watchdog 120 s) and took its first lock
//     in the stalled purchase, so no renewal of it is sent before its
//     write: it cannot know. A second buyer takes the lock on the new
//     master and buys; the stalled purchase, released, writes before any
//     notice — and the fence refuses it.
//   - Instance 0 renews every 5 s (watchdog 15 s, longer than the failover
//     takes, so that it is the renewal finding the lock gone that tells it,
//     not its lease running out): the stalled purchase's context is
//     cancelled with lock.ErrLost while it stalls, before anyone else
//     enters; released, its write is refused before it is sent.
//
// The run fails unless at least one write was refused by the fence and one
// holder was told, and the database shows every unit sold once and one
// order per buyer. The recorded history may show the fenced holder
// overlapping the next (it was never told while inside: the lock is only an
// efficiency lock there), and nothing else.
func TestFailover_MasterKilledMidSaleFencesAndTellsTheLostHolders(t *testing.T) {
	const (
		sku       = "sku-failover"
		skuTold   = "sku-told"
		skuFenced = "sku-fenced"
		stock     = 60
		buyers    = 150
		workers   = 8
	)
	env := testenv.Sentinel(t)
	dsn := testenv.MySQL(t)
	db := seedShop(t, dsn, sku, stock)
	if err := db.Create(&shopProduct{SKU: skuTold, Stock: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&shopProduct{SKU: skuFenced, Stock: 1}).Error; err != nil {
		t.Fatal(err)
	}
	toldShop := failoverShop(t, env, dsn, 15*time.Second)
	fencedShop := failoverShop(t, env, dsn, 120*time.Second)
	// The sale's locks have short leases: the failover may also bring back
	// a sale's lock that was released on the old master after the replica
	// last heard from it (the replica applied the acquisition, never the
	// release). Nobody holds it, nobody renews it, and it keeps the SKU
	// busy until its lease ends: 2 s here, 15 s on instance 0.
	saleShop := failoverShop(t, env, dsn, 2*time.Second)
	saleShop2 := failoverShop(t, env, dsn, 2*time.Second)
	shops := []*shopInstance{toldShop, fencedShop, saleShop, saleShop2}
	rec := history.NewRecorder()
	for _, in := range shops {
		in.rec.Store(rec)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	type answer struct {
		status int
		code   string
	}
	// buyUntilAnswered retries while the failover settles (503, busy).
	buyUntilAnswered := func(url, sku, user string) answer {
		for range 100 {
			s, c := buyOnce(client, url, sku, user, "")
			if s == http.StatusCreated || s == http.StatusConflict && c != "busy" {
				return answer{s, c}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s's purchase of %s never answered", user, sku)
		return answer{}
	}

	// The sale goes on throughout, on instances 2 and 3.
	progress := make(chan struct{})
	var once sync.Once
	saleDone := make(chan *saleResult, 1)
	start := time.Now()
	var saleEnded time.Duration
	go func() {
		res := sell(t, []string{saleShop.url, saleShop2.url}, sku, buyers, workers, func(done int) {
			if done == buyers/5 {
				once.Do(func() { close(progress) })
			}
		})
		saleEnded = time.Since(start)
		saleDone <- res
	}()
	select {
	case <-progress:
	case <-time.After(60 * time.Second):
		t.Fatal("the sale did not get going")
	}

	// The replica stops hearing from the master; two purchases take their
	// locks on the master only, read, and stall.
	env.Replica.Pause()
	env.Master.Do("CLIENT", "KILL", "TYPE", "replica")
	toldStall, fencedStall := toldShop.stall("told"), fencedShop.stall("fenced")
	toldAnswer, fencedAnswer := make(chan answer, 1), make(chan answer, 1)
	go func() { s, c := buyOnce(client, toldShop.url, skuTold, "told", ""); toldAnswer <- answer{s, c} }()
	go func() { s, c := buyOnce(client, fencedShop.url, skuFenced, "fenced", ""); fencedAnswer <- answer{s, c} }()
	for _, st := range []*stall{toldStall, fencedStall} {
		select {
		case <-st.reached:
		case <-time.After(10 * time.Second):
			t.Fatal("a stalled purchase never read")
		}
	}
	env.Master.Kill()
	killedAt := time.Since(start)
	env.Replica.Resume()
	env.WaitForFailover(30 * time.Second)
	for _, k := range []string{"sku:" + skuTold, "sku:" + skuFenced} {
		if env.Replica.Do("EXISTS", k) != int64(0) {
			t.Fatalf("the promoted replica has %s: the failover did not lose it", k)
		}
	}

	// The fenced SKU: another buyer gets in on the new master and buys;
	// the stalled purchase, never told, writes and is refused by the fence.
	if a := buyUntilAnswered(saleShop.url, skuFenced, "after-fenced"); a.status != http.StatusCreated {
		t.Fatalf("the buyer after the failover on %s: %d %s, want 201", skuFenced, a.status, a.code)
	}
	if err := fencedStall.ctx.Err(); err != nil {
		t.Fatalf("the stalled purchase on instance 1 was told before its write (%v): its watchdog renewed early", context.Cause(fencedStall.ctx))
	}
	close(fencedStall.release)
	fenced := <-fencedAnswer

	// The told SKU: the stalled purchase is told while it stalls, before
	// anyone else gets in; released, it writes nothing.
	select {
	case <-toldStall.ctx.Done():
	case <-time.After(25 * time.Second):
		t.Errorf("the stalled purchase on instance 0, whose lock the failover lost, was never told")
	}
	told := context.Cause(toldStall.ctx)
	if a := buyUntilAnswered(saleShop.url, skuTold, "after-told"); a.status != http.StatusCreated {
		t.Fatalf("the buyer after the failover on %s: %d %s, want 201", skuTold, a.status, a.code)
	}
	close(toldStall.release)
	toldA := <-toldAnswer

	res := <-saleDone
	if saleEnded < killedAt {
		t.Errorf("the sale ended %v in, before the master was killed at %v", saleEnded, killedAt)
	}
	orders := checkSale(t, db, sku, stock, res)
	checkSale(t, db, skuTold, 1, &saleResult{ordered: []string{"after-told"}})
	checkSale(t, db, skuFenced, 1, &saleResult{ordered: []string{"after-fenced"}})
	var refused, toldN, stale int64
	for _, in := range shops {
		refused += in.fence.Load()
		toldN += in.told.Load()
		stale += in.stale.Load()
	}
	r := checkShopSKUs(t, rec, db, map[string]int{sku: stock, skuTold: 1, skuFenced: 1})
	t.Logf("master killed %v into the sale, which ended at %v; %d orders of %d units, %d requests, answers %v", killedAt.Round(time.Millisecond),
		saleEnded.Round(time.Millisecond), orders, stock, res.attempts.Load(), res.statuses)
	t.Logf("refused by the fence: %d; told of the loss: %d (%d purchases refused in all); the fenced purchase was answered %d %s, the told one %d %s (cause %v)",
		refused, toldN, stale, fenced.status, fenced.code, toldA.status, toldA.code, told)
	t.Logf("history: %s", r)
	if orders != stock {
		t.Errorf("%d orders for %d units and %d buyers: the sale did not go on after the failover", orders, stock, buyers)
	}
	if refused == 0 || fencedShop.fence.Load() != 1 || fencedStall.toldBeforeWrite.Load() || fenced.status != http.StatusConflict {
		t.Errorf("the fence refused %d writes (instance 1: %d); the purchase stalled on instance 1 was answered %d %s: want its write, sent before any notice, refused by the fence",
			refused, fencedShop.fence.Load(), fenced.status, fenced.code)
	}
	if toldN == 0 || !errors.Is(told, lock.ErrLost) || !toldStall.toldBeforeWrite.Load() || toldA.status != http.StatusConflict {
		t.Errorf("%d holders told of their loss; the purchase stalled on instance 0 had cause %v and was answered %d %s: want it told (lock.ErrLost) before its write and refused",
			toldN, told, toldA.status, toldA.code)
	}
	for _, a := range r.Anomalies {
		if a.Kind != history.Overlap && a.Kind != history.LateNotice || a.Key != "sku:"+skuFenced && a.Key != "sku:"+sku {
			t.Errorf("history: %s", a)
		}
	}
}

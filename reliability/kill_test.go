package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A holder process killed with SIGKILL after its write committed and before
// its Unlock: nothing renews its lock, which comes back within one lease
// (the watchdog timeout from the last renewal), never before Redis expires
// it; the next holder reads the committed write and adds its own, so the
// register counts both once — no write is lost or repeated — and the
// history is clean. The dead process's hold is recorded as ending when it
// was killed.
func TestKill_HolderKilledBetweenCommitAndUnlock(t *testing.T) {
	const (
		key      = "sku:kill"
		watchdog = 900 * time.Millisecond
	)
	bin := binary(t, faults.HolderPackage)
	srv := testenv.Redis(t)
	db, dsn := registers(t, key)
	rec := history.NewRecorder()

	a := faults.StartHolder(t, bin, "a", srv.Addr, dsn, faults.HolderOptions{Watchdog: watchdog})
	locked := a.Lock(key, 10*time.Second)
	a.Read(key)
	w := a.Write(key)
	if !w.Accepted {
		t.Fatalf("the holder's write: %+v", w)
	}
	a.Kill()
	killed := history.Now()
	ttl := time.Duration(srv.Do("PTTL", key).(int64)) * time.Millisecond
	if ttl <= 0 {
		t.Fatalf("the killed holder's lock has PTTL %v: it was released, not left behind", ttl)
	}
	rec.AddHold(history.Hold{Key: key, Owner: "a", Token: locked.Token, Enter: time.Unix(0, locked.At), Leave: killed})
	rec.AddWrite(history.Write{Key: key, Owner: "a", Token: w.Token, Read: w.Read, ReadAt: time.Unix(0, w.ReadAt),
		Value: w.Value, Start: time.Unix(0, w.Start), End: time.Unix(0, w.End), Accepted: true})

	b := lockClient(t, srv.Addr, nil, lock.WithWatchdogTimeout(watchdog))
	ctx, err := b.Mutex(key).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatalf("the lock of the killed holder did not come back: %v", err)
	}
	waited := history.Now().Sub(killed)
	s := enter(rec, "b", key, ctx)
	if waited > watchdog+300*time.Millisecond || waited < ttl-50*time.Millisecond {
		t.Errorf("the next holder got the lock %v after the kill; its key had %v to live, the lease is %v", waited, ttl, watchdog)
	}
	if s.Token() <= locked.Token {
		t.Errorf("the next holder's token %d is not above the killed holder's %d", s.Token(), locked.Token)
	}
	if err := s.Read(db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(db, true); err != nil {
		t.Fatalf("the next holder's write: %v", err)
	}
	s.Leave()
	_ = b.Mutex(key).Unlock(ctx)
	r := check(t, rec, db)
	t.Logf("killed with %v left on its lease; the next holder got in %v later; %s", ttl, waited.Round(time.Millisecond), r)
	if !r.OK() {
		t.Fatalf("history: %s", r)
	}
	if v := finalValues(t, db)[key]; v != 2 {
		t.Fatalf("register %d, want 2: the committed write and the next holder's, once each", v)
	}
}

// killAnswer is one answer of the reference service to a purchase.
type killAnswer struct {
	status   int
	code     string
	replayed string
	order    uint64
}

// buyWithKey sends user's purchase of sku, with an Idempotency-Key, to the
// instance at url.
func buyWithKey(t *testing.T, url, sku, user, key string) killAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/api/seckill/"+sku, nil)
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return killAnswer{code: err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var o struct {
		ID uint64 `json:"id"`
	}
	_ = json.Unmarshal(body, &o)
	return killAnswer{status: resp.StatusCode, code: errorCode(body), replayed: resp.Header.Get(guard.ReplayedHeader), order: o.ID}
}

// An instance of the reference service killed with SIGKILL while it handles
// a purchase that carries an Idempotency-Key, after the database committed
// the order and before the instance could finish the key's record: it is
// frozen the moment its COMMIT reaches the database (a proxy in front of
// MariaDB), the COMMIT runs, and the instance is killed without having run
// again. Its idempotency record stays "in progress" in Redis, renewed by
// nobody. The buyer's retry with the same key on another instance is
// answered 409 request_in_progress while the record lives; once it has run
// out (one watchdog lease), the retry runs the purchase again, which the
// unique index on the key refuses, and is answered 201 with the first
// order, replayed; asked again, the stored answer is the same order. The
// database has one order of that buyer and one unit gone, and the SKU's
// lock is free for the next buyer.
func TestKill_InstanceKilledAfterCommitWithAnIdempotencyKeyLeavesOneOrder(t *testing.T) {
	const (
		sku      = "sku-killed"
		watchdog = time.Second
	)
	bin := binary(t, seckillPackage)
	srv := testenv.Redis(t)
	dsn := testenv.MySQL(t)
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faults.NewProxy(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg.Addr = proxy.Addr
	redisURL := "REDIS_URL=redis://" + srv.Addr
	victim := startSeckill(t, bin, []string{redisURL, "MYSQL_DSN=" + cfg.FormatDSN()}, "-watchdog", watchdog.String())
	other := startSeckill(t, bin, []string{redisURL, "MYSQL_DSN=" + dsn}, "-watchdog", watchdog.String())
	resp, err := http.Post(other.url+"/api/admin/products", "application/json",
		strings.NewReader(fmt.Sprintf(`{"sku":%q,"name":"reliability","stock":5}`, sku)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("creating the product: %d", resp.StatusCode)
	}
	db := openPlain(t, dsn)
	state := func() (stock, orders, mine int) {
		t.Helper()
		if err := db.Raw("SELECT stock FROM products WHERE sku = ?", sku).Scan(&stock).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Raw("SELECT COUNT(*) FROM orders WHERE sku = ?", sku).Scan(&orders).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Raw("SELECT COUNT(*) FROM orders WHERE sku = ? AND user_id = 'u1'", sku).Scan(&mine).Error; err != nil {
			t.Fatal(err)
		}
		return
	}

	// The COMMIT that follows the order's INSERT freezes the victim just
	// before it reaches the database.
	var mu sync.Mutex
	sawOrder := false
	match := func(chunk []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		if bytes.Contains(chunk, []byte("INSERT INTO `orders`")) {
			sawOrder = true
		}
		return sawOrder && bytes.Contains(chunk, []byte("\x03COMMIT"))
	}
	lost := proxy.LoseReplyTo(match, victim.Stop)
	first := make(chan killAnswer, 1)
	go func() { first <- buyWithKey(t, victim.url, sku, "u1", "k1") }()
	select {
	case <-lost:
	case <-time.After(15 * time.Second):
		t.Fatal("the victim's COMMIT never reached the database")
	}
	victim.Kill()
	killed := time.Now()
	if stock, orders, mine := state(); stock != 4 || orders != 1 || mine != 1 {
		t.Fatalf("after the kill: stock %d, %d orders (%d of u1), want 4 and 1: the COMMIT did not commit, so this test shows nothing", stock, orders, mine)
	}
	var firstOrder uint64
	if err := db.Raw("SELECT id FROM orders WHERE sku = ? AND user_id = 'u1'", sku).Scan(&firstOrder).Error; err != nil {
		t.Fatal(err)
	}

	// The retry on the other instance: in progress while the dead
	// instance's record lives, then the first order.
	early := buyWithKey(t, other.url, sku, "u1", "k1")
	if early.status != http.StatusConflict || early.code != "request_in_progress" {
		t.Errorf("the retry %v after the kill: %d %s, want 409 request_in_progress (the record of the dead instance lives for one lease)",
			time.Since(killed).Round(time.Millisecond), early.status, early.code)
	}
	var retry killAnswer
	inProgress := 0
	for {
		retry = buyWithKey(t, other.url, sku, "u1", "k1")
		if retry.status != http.StatusConflict || retry.code != "request_in_progress" {
			break
		}
		inProgress++
		if time.Since(killed) > 3*watchdog {
			t.Fatalf("the key is still in progress %v after the kill, with a lease of %v", time.Since(killed).Round(time.Millisecond), watchdog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	freed := time.Since(killed)
	if retry.status != http.StatusCreated || retry.replayed != "true" || retry.order != firstOrder {
		t.Fatalf("the retry once the record ran out: %+v, want 201 replaying order %d", retry, firstOrder)
	}
	again := buyWithKey(t, other.url, sku, "u1", "k1")
	if again.status != http.StatusCreated || again.replayed != "true" || again.order != firstOrder {
		t.Fatalf("the retry after that: %+v, want the stored answer, order %d", again, firstOrder)
	}
	if next := buyWithKey(t, other.url, sku, "u2", "k2"); next.status != http.StatusCreated {
		t.Fatalf("the next buyer after the kill: %+v, want 201", next)
	}
	stock, orders, mine := state()
	t.Logf("killed after its COMMIT; the retry was in progress %d times, ran %v after the kill (lease %v) and replayed order %d; stock %d, %d orders, %d of the retrying buyer",
		inProgress+1, freed.Round(time.Millisecond), watchdog, firstOrder, stock, orders, mine)
	if stock != 3 || orders != 2 || mine != 1 {
		t.Fatalf("stock %d, %d orders, %d of u1: want 3, 2 and 1 — one order per purchase, none twice", stock, orders, mine)
	}
	if a := <-first; a.status != 0 {
		t.Errorf("the killed instance answered %+v", a)
	}
}

package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// withUser plays the authentication middleware: the caller's id from a header.
func withUser(c *gin.Context) {
	if u := c.GetHeader("X-User-ID"); u != "" {
		c.Set("user_id", u)
	}
}

// payments counts handler executions and answers with the execution number.
type payments struct{ runs atomic.Int32 }

func (p *payments) pay(c *gin.Context) {
	n := p.runs.Add(1)
	c.Header("Location", fmt.Sprintf("/payments/%d", n))
	c.JSON(http.StatusCreated, gin.H{"payment": n})
}

func idemInstance(t testing.TB, srv *testenv.RedisServer, h gin.HandlerFunc, opts ...guard.RouteOption) *instance {
	opts = append([]guard.RouteOption{guard.Scope("<ctx:user_id>"), guard.ReplayHeaders("Location")}, opts...)
	return newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		r.POST("/pay", g.Idempotent(opts...), h)
	})
}

func TestIdempotent_SameKeyTwiceRunsOnceAndReplays(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	first := do(t, "POST", in.srv.URL+"/pay", `{"amount":10}`, "Idempotency-Key", `"k-1"`, "X-User-ID", "u1")
	second := do(t, "POST", in.srv.URL+"/pay", `{ "amount" : 10 }`, "Idempotency-Key", `"k-1"`, "X-User-ID", "u1")
	if first.status != 201 || second.status != 201 || string(first.body) != string(second.body) {
		t.Fatalf("first %d %s, second %d %s", first.status, first.body, second.status, second.body)
	}
	if p.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", p.runs.Load())
	}
	if second.header.Get("Idempotent-Replayed") != "true" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("only the replay carries Idempotent-Replayed: true")
	}
	if second.header.Get("Location") != first.header.Get("Location") || second.header.Get("Content-Type") != first.header.Get("Content-Type") {
		t.Fatalf("replayed headers differ: %v vs %v", second.header, first.header)
	}
}

func TestIdempotent_ReplayCostsOneRoundTrip(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	counter := testenv.NewCommandCounter()
	in := idemInstance(t, srv, p.pay)
	in.rdb.AddHook(counter)
	do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "k", "X-User-ID", "u1")
	before := counter.Snapshot()
	r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "k", "X-User-ID", "u1")
	after := counter.Snapshot()
	var n int64
	for k, v := range after {
		n += v - before[k]
	}
	if r.status != 201 || r.header.Get(guard.ReplayedHeader) != "true" || n != 1 {
		t.Fatalf("replay: %d, %d commands (%v -> %v); want one (the begin script, which finds the record)", r.status, n, before, after)
	}
}

func TestIdempotent_FiftyConcurrentAcrossThreeInstancesRunOnce(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			srv := testenv.Redis(t)
			var p payments
			slow := func(c *gin.Context) { time.Sleep(150 * time.Millisecond); p.pay(c) }
			var opts []guard.RouteOption
			if wait {
				opts = append(opts, guard.WaitForFirst(10*time.Second))
			}
			var inst []*instance
			for i := 0; i < 3; i++ {
				inst = append(inst, idemInstance(t, srv, slow, opts...))
			}
			var mu sync.Mutex
			statuses := map[int]int{}
			bodies := map[string]int{}
			var wg sync.WaitGroup
			for i := 0; i < 50; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := do(t, "POST", inst[i%3].srv.URL+"/pay", `{"amount":5}`, "Idempotency-Key", "same", "X-User-ID", "u1")
					mu.Lock()
					statuses[r.status]++
					if r.status == 201 {
						bodies[string(r.body)]++
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			if p.runs.Load() != 1 {
				t.Fatalf("handler ran %d times for one key", p.runs.Load())
			}
			if wait {
				if statuses[201] != 50 || len(bodies) != 1 {
					t.Fatalf("with waiting every request gets the first answer: %v %v", statuses, bodies)
				}
			} else if statuses[201]+statuses[409] != 50 || statuses[409] == 0 {
				t.Fatalf("without waiting duplicates get 409 (or a replay once done): %v", statuses)
			}
		})
	}
}

func TestIdempotent_KeyReusedWithAnotherBodyIs422(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	do(t, "POST", in.srv.URL+"/pay", `{"amount":10}`, "Idempotency-Key", "k", "X-User-ID", "u1")
	r := do(t, "POST", in.srv.URL+"/pay", `{"amount":11}`, "Idempotency-Key", "k", "X-User-ID", "u1")
	if r.status != 422 || r.errorCode() != "idempotency_key_reused" || p.runs.Load() != 1 {
		t.Fatalf("same key, other body: %d %s (runs %d)", r.status, r.body, p.runs.Load())
	}
}

func TestIdempotent_CallersNeverShareRecords(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	a := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "k", "X-User-ID", "alice")
	b := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "k", "X-User-ID", "bob")
	if p.runs.Load() != 2 || string(a.body) == string(b.body) || b.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("bob was served alice's response: %s / %s", a.body, b.body)
	}
	if r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", "k"); r.status != 400 || r.errorCode() != "missing_field" {
		t.Fatalf("no caller identity: %d %s", r.status, r.body)
	}
}

func TestIdempotent_FailuresLetTheRetryRunAgain(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		idem := g.Idempotent(guard.Scope("<ctx:user_id>"))
		r.POST("/fail", idem, func(c *gin.Context) {
			if runs.Add(1) == 1 {
				c.JSON(503, gin.H{"error": "downstream"})
				return
			}
			c.JSON(200, gin.H{"ok": true})
		})
		r.POST("/panic", idem, func(c *gin.Context) {
			if runs.Add(1) == 3 {
				panic("bug")
			}
			c.JSON(200, gin.H{"ok": true})
		})
		r.POST("/busy", idem, func(c *gin.Context) { runs.Add(1); c.JSON(429, gin.H{"error": "busy"}) })
	})
	h := []string{"Idempotency-Key", "k", "X-User-ID", "u1"}
	if r := do(t, "POST", in.srv.URL+"/fail", "", h...); r.status != 503 {
		t.Fatalf("first: %d", r.status)
	}
	if r := do(t, "POST", in.srv.URL+"/fail", "", h...); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a 5xx must run again: %d %v", r.status, r.header)
	}
	if r := do(t, "POST", in.srv.URL+"/panic", "", h...); r.status != 500 {
		t.Fatalf("panic: %d", r.status)
	}
	if r := do(t, "POST", in.srv.URL+"/panic", "", h...); r.status != 200 || runs.Load() != 4 {
		t.Fatalf("retry after a panic must run again: %d (runs %d)", r.status, runs.Load())
	}
	do(t, "POST", in.srv.URL+"/busy", "", h...)
	do(t, "POST", in.srv.URL+"/busy", "", h...)
	if runs.Load() != 6 {
		t.Fatalf("a 429 answer was replayed instead of retried (runs %d)", runs.Load())
	}
}

func TestIdempotent_DeadInstanceFreesTheKeyAfterItsLease(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	stuck := make(chan struct{})
	dying := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		r.POST("/pay", g.Idempotent(guard.Scope("<ctx:user_id>"), guard.InProgressLease(600*time.Millisecond)), func(c *gin.Context) { <-stuck })
	})
	var unstick sync.Once
	t.Cleanup(func() { unstick.Do(func() { close(stuck) }) }) // before the server closes, however the test ends
	healthy := idemInstance(t, srv, p.pay)
	h := []string{"Idempotency-Key", "k", "X-User-ID", "u1"}

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", dying.srv.URL+"/pay", nil)
		req.Header.Set(h[0], h[1])
		req.Header.Set(h[2], h[3])
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	if r := do(t, "POST", healthy.srv.URL+"/pay", "", h...); r.status != 409 {
		t.Fatalf("while the first runs: %d %s", r.status, r.body)
	}
	cancel()
	dying.g.Close() // the instance dies: nothing renews its in-progress lock
	died := time.Now()
	var r reply
	eventually(t, func() bool {
		r = do(t, "POST", healthy.srv.URL+"/pay", "", h...)
		return r.status == 201
	})
	if d := time.Since(died); d > 2*time.Second {
		t.Fatalf("key usable again only after %v", d)
	}
	unstick.Do(func() { close(stuck) })
	if p.runs.Load() != 1 {
		t.Fatalf("runs %d", p.runs.Load())
	}
}

func TestIdempotent_RejectsBadKeys(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		r.POST("/pay", g.Idempotent(guard.Scope("<ctx:user_id>")), p.pay)
		r.POST("/json", g.Idempotent(guard.Scope("<ctx:user_id>"), guard.UseFingerprint(guard.FingerprintJSON)), p.pay)
		r.POST("/optional", g.Idempotent(guard.Scope("<ctx:user_id>"), guard.OptionalKey()), p.pay)
	})
	url := in.srv.URL
	cases := map[string]string{
		"oversized":        `"` + strings.Repeat("k", 256) + `"`,
		"empty string":     `""`,
		"non-ASCII":        `"ключ"`,
		"unterminated":     `"abc`,
		"bad escape":       `"a\nb"`,
		"parameters":       `"abc";p=1`,
		"list":             `"a", "b"`,
		"token with =":     `abc=def`,
		"token with space": `abc def`,
	}
	for name, key := range cases {
		r := do(t, "POST", url+"/pay", "", "Idempotency-Key", key, "X-User-ID", "u1")
		if r.status != 400 || r.errorCode() != "idempotency_key_invalid" {
			t.Errorf("%s %q: %d %s", name, key, r.status, r.body)
		}
	}
	for _, ok := range []string{`"` + strings.Repeat("k", 255) + `"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", "*a:b/c", "1abc", `"with \"quotes\" and \\"`} {
		if r := do(t, "POST", url+"/pay", "", "Idempotency-Key", ok, "X-User-ID", "u1"); r.status != 201 {
			t.Errorf("valid key %q refused: %d %s", ok, r.status, r.body)
		}
	}
	if r := do(t, "POST", url+"/pay", "", "X-User-ID", "u1"); r.status != 400 || r.errorCode() != "idempotency_key_missing" {
		t.Errorf("missing key: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", url+"/optional", "", "X-User-ID", "u1"); r.status != 201 {
		t.Errorf("optional key absent: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest("POST", url+"/json", strings.NewReader("amount=10"))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-User-ID", "u1")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("non-JSON body with a JSON fingerprint: %d", resp.StatusCode)
	}
	if keys, _ := in.rdb.Keys(context.Background(), "seckillguard:idem:*").Result(); len(keys) != 5 {
		t.Errorf("records %d, want 5 (one per accepted key): refused requests must leave nothing", len(keys))
	}
}

// The database backstop: the record id goes into a unique column of the row
// the request creates, so a repeat that finds no Redis record (flushed,
// failed over) is still refused, and answered with the first result.
func TestIdempotent_DatabaseStillRefusesWhenTheRecordIsLost(t *testing.T) {
	srv := testenv.Redis(t)
	db, err := sql.Open("mysql", testenv.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, idem CHAR(32) NOT NULL, UNIQUE KEY uk_orders_idem (idem))"); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		r.POST("/orders", g.Idempotent(guard.Scope("<ctx:user_id>")), func(c *gin.Context) {
			runs.Add(1)
			rec, _ := guard.IdempotencyRecord(c)
			res, err := db.ExecContext(c.Request.Context(), "INSERT INTO orders (idem) VALUES (?)", rec)
			var me *mysql.MySQLError
			if errors.As(err, &me) && me.Number == 1062 {
				var id int64
				if err := db.QueryRowContext(c.Request.Context(), "SELECT id FROM orders WHERE idem = ?", rec).Scan(&id); err != nil {
					c.JSON(500, gin.H{"error": err.Error()})
					return
				}
				c.JSON(201, gin.H{"order": id})
				return
			}
			if err != nil {
				c.JSON(500, gin.H{"error": err.Error()})
				return
			}
			id, _ := res.LastInsertId()
			c.JSON(201, gin.H{"order": id})
		})
	})
	h := []string{"Idempotency-Key", "order-7", "X-User-ID", "u1"}
	first := do(t, "POST", in.srv.URL+"/orders", `{}`, h...)
	keys, _ := in.rdb.Keys(context.Background(), "seckillguard:idem:*:r").Result()
	in.rdb.Del(context.Background(), keys...) // the Redis record is lost
	second := do(t, "POST", in.srv.URL+"/orders", `{}`, h...)
	var n int
	db.QueryRow("SELECT COUNT(*) FROM orders").Scan(&n)
	if n != 1 || runs.Load() != 2 || string(first.body) != string(second.body) {
		t.Fatalf("orders %d, runs %d, answers %s / %s: want one order and the same answer", n, runs.Load(), first.body, second.body)
	}
}

func TestIdempotent_LostLockAnswerIsNotReplayed(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Idempotent(guard.Unscoped()), g.Lock("sku:<sku>", guard.Lease(50*time.Millisecond)), func(c *gin.Context) {
			if runs.Add(1) == 1 {
				<-c.Request.Context().Done() // the work outlives the lease
				return
			}
			c.JSON(201, gin.H{"ok": true})
		})
	})
	h := []string{"Idempotency-Key", "k"}
	if r := do(t, "POST", in.srv.URL+"/buy/1", `{}`, h...); r.status != 409 || r.errorCode() != "lock_lost" {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", in.srv.URL+"/buy/1", `{}`, h...); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after a lost lock must run again, got %d %s %v", r.status, r.body, r.header)
	}
}

func TestIdempotent_HandlersGetNoTokenAndKeysAllExpire(t *testing.T) {
	srv := testenv.Redis(t)
	var tokens atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/pay", g.Idempotent(guard.Unscoped(), guard.RecordTTL(time.Minute)), func(c *gin.Context) {
			if _, ok := guard.Token(c); ok {
				tokens.Add(1) // would fence the handler's writes with an unrelated token
			}
			c.Status(201)
		})
	})
	for i := 0; i < 5; i++ {
		if r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", fmt.Sprintf("k%d", i)); r.status != 201 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if tokens.Load() != 0 {
		t.Fatalf("%d idempotent handlers saw a fencing token of the framework's own", tokens.Load())
	}
	keys, _ := in.rdb.Keys(context.Background(), "*").Result()
	for _, k := range keys {
		if ttl, _ := in.rdb.PTTL(context.Background(), k).Result(); ttl < 0 {
			t.Errorf("key %q has no expiry: every idempotency key would leave one behind", k)
		}
	}
	if len(keys) != 5 {
		t.Errorf("keys %v, want the 5 records", keys)
	}
}

// recordsIn returns the idempotency records (and in-progress markers) in
// Redis, by key.
func recordsIn(t testing.TB, in *instance) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := in.rdb.Keys(ctx, "seckillguard:idem:*:r").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		v, err := in.rdb.Get(ctx, k).Result()
		if err == nil {
			out[k] = v
		}
	}
	return out
}

// The lock step runs after the idempotency step has marked the key; what
// the lock step answers itself (a key field missing or unsafe, a body over
// its limit, busy, the client gone while waiting) is the framework's answer,
// not the handler's: it is never stored, and the retry runs.
func TestIdempotent_FrameworkAnswersAreNotStored(t *testing.T) {
	srv := testenv.Redis(t)
	var runs atomic.Int32
	h := func(c *gin.Context) { runs.Add(1); c.JSON(201, gin.H{"sku": c.Param("sku")}) }
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		// StoreClientErrors: a 4xx of the handler would be stored, so only
		// the framework's mark keeps its own 4xx answers out.
		idem := g.Idempotent(guard.Unscoped(), guard.StoreClientErrors())
		r.POST("/path/:sku", idem, g.Lock("sku:<sku>", guard.Wait(10*time.Second)), h)
		r.POST("/body", idem, g.Lock("sku:<body:sku>", guard.BodyLimit(64)), h)
	})
	for _, tc := range []struct{ name, path, body, code string }{
		{"unsafe value", "/path/a%7Bb", `{}`, "unsafe_value"},
		{"missing field", "/body", `{"other":1}`, "missing_field"},
		{"body over the lock's limit", "/body", `{"sku":"` + strings.Repeat("x", 100) + `"}`, "body_too_large"},
	} {
		key := "k-" + strings.ReplaceAll(tc.name, " ", "-")
		first := do(t, "POST", in.srv.URL+tc.path, tc.body, "Idempotency-Key", key)
		if first.status/100 != 4 || first.errorCode() != tc.code {
			t.Fatalf("%s: %d %s, want 4xx %s", tc.name, first.status, first.body, tc.code)
		}
		if recs := recordsIn(t, in); len(recs) != 0 {
			t.Errorf("%s: the framework's own %d was stored: %v", tc.name, first.status, recs)
		}
		again := do(t, "POST", in.srv.URL+tc.path, tc.body, "Idempotency-Key", key)
		if again.header.Get(guard.ReplayedHeader) != "" || again.errorCode() != tc.code {
			t.Errorf("%s: the retry was replayed %d %s instead of running", tc.name, again.status, again.body)
		}
	}

	// The client gives up while the request waits for the lock.
	locks := lock.New(in.rdb)
	defer locks.Close()
	m := locks.Mutex("sku:1")
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		req, _ := http.NewRequestWithContext(ctx, "POST", in.srv.URL+"/path/1", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-gone")
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, func() bool { // the key is marked: the request waits for the lock
		for _, v := range recordsIn(t, in) {
			if strings.HasPrefix(v, "p") {
				return true
			}
		}
		return false
	})
	cancel()
	<-gone
	eventually(t, func() bool { // the server has finished with the request
		for _, v := range recordsIn(t, in) {
			if strings.HasPrefix(v, "p") {
				return false
			}
		}
		return true
	})
	if recs := recordsIn(t, in); len(recs) != 0 {
		t.Errorf("the answer to a client that went away was stored: %v", recs)
	}
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	before := runs.Load()
	r := do(t, "POST", in.srv.URL+"/path/1", `{}`, "Idempotency-Key", "k-gone")
	if r.status != 201 || r.header.Get(guard.ReplayedHeader) != "" || runs.Load() != before+1 {
		t.Fatalf("retry after the client went away: %d %s %v, want the handler to run", r.status, r.body, r.header)
	}
}

// A request's identity is its method, route template, path parameters,
// query, media type and body: the same key with any of them changed is
// another request, answered 422, and the handler does not run.
func TestIdempotent_KeyReusedWithAnotherIdentityIs422(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/buy/:sku", g.Idempotent(guard.Unscoped()), p.pay)
	})
	send := func(path, ctype, body, key string) reply {
		req, _ := http.NewRequest("POST", in.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf strings.Builder
		_, _ = io.Copy(&buf, resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: []byte(buf.String())}
	}
	const js = "application/json"
	for _, tc := range []struct{ name, path, ctype, body string }{
		{"another path parameter", "/buy/sku-2?n=1", js, `{"n":1}`},
		{"another query", "/buy/sku-1?n=2", js, `{"n":1}`},
		{"another query value order", "/buy/sku-1?n=1&n=2", js, `{"n":1}`},
		{"another media type", "/buy/sku-1?n=1", "text/plain", `{"n":1}`},
		{"another body", "/buy/sku-1?n=1", js, `{"n":2}`},
	} {
		key := "k-" + strings.ReplaceAll(tc.name, " ", "-")
		if r := send("/buy/sku-1?n=1", js, `{"n":1}`, key); r.status != 201 {
			t.Fatalf("%s: first: %d %s", tc.name, r.status, r.body)
		}
		before := p.runs.Load()
		if r := send(tc.path, tc.ctype, tc.body, key); r.status != 422 || r.errorCode() != "idempotency_key_reused" || p.runs.Load() != before {
			t.Errorf("%s: %d %s (handler runs %d -> %d), want 422 idempotency_key_reused", tc.name, r.status, r.body, before, p.runs.Load())
		}
	}
	// What does not change the request does not change its identity.
	if r := send("/buy/sku-1?n=1", js, `{"n":1}`, "k-same"); r.status != 201 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ path, ctype, body string }{
		{"/buy/sku-1?n=1", "application/json; charset=utf-8", ` { "n" : 1 } `},
		{"/buy/sku-1?%6E=%31", "Application/JSON", `{"n":1}`},
	} {
		if r := send(tc.path, tc.ctype, tc.body, "k-same"); r.status != 201 || r.header.Get(guard.ReplayedHeader) != "true" {
			t.Errorf("%s %s %s: %d %s, want the first answer replayed", tc.path, tc.ctype, tc.body, r.status, r.body)
		}
	}
}

// {"amount":1,"AMOUNT":2} binds amount=2 into a struct, and with its
// members swapped amount=1: one canonical form for both would replay one
// purchase for the other. Such a body is refused, as the key lookup
// refuses it, and the handler does not run.
func TestIdempotent_CaseVariantMembersAreRefused(t *testing.T) {
	srv := testenv.Redis(t)
	var p payments
	in := idemInstance(t, srv, p.pay)
	for _, body := range []string{`{"amount":1,"AMOUNT":2}`, `{"AMOUNT":2,"amount":1}`, `{"order":{"sku":"a","Sku":"b"}}`} {
		r := do(t, "POST", in.srv.URL+"/pay", body, "Idempotency-Key", "k", "X-User-ID", "u1")
		if r.status != 400 || r.errorCode() != "bad_body" {
			t.Errorf("%s: %d %s, want 400 bad_body", body, r.status, r.body)
		}
	}
	if p.runs.Load() != 0 || len(recordsIn(t, in)) != 0 {
		t.Fatalf("handler ran %d times, records %v", p.runs.Load(), recordsIn(t, in))
	}
}

// TestIdempotent_LargeBodyCostsASmallMultipleOfItself: a request with a
// 1 MiB JSON body, served whole (body read once, fingerprinted, handler,
// record stored), allocates a small multiple of the body; decoding it into
// map[string]any and marshalling it again cost some 20 times the body.
func TestIdempotent_LargeBodyCostsASmallMultipleOfItself(t *testing.T) {
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/orders", g.Idempotent(guard.Unscoped()), func(c *gin.Context) { c.Status(201) })
	})
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := 0; b.Len() < 1<<20-200; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"sku-%d","qty":%d,"note":"gift wrap, please"}`, i, i%7)
	}
	b.WriteString(`]}`)
	body := b.String()
	serve := func(key string) int {
		req := httptest.NewRequest("POST", "/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		in.r.ServeHTTP(w, req)
		return w.Code
	}
	serve("warm-up")
	best := ^uint64(0)
	for i := range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if code := serve(fmt.Sprintf("k%d", i)); code != 201 {
			t.Fatalf("status %d", code)
		}
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	t.Logf("a request with a %d-byte body allocated %d bytes (%.2fx)", len(body), best, float64(best)/float64(len(body)))
	if limit := 3 * uint64(len(body)); best > limit {
		t.Fatalf("a request with a %d-byte body allocated %d bytes (%.1fx the body), want at most %d", len(body), best, float64(best)/float64(len(body)), limit)
	}
}

// A 4xx of the handler says that nothing happened (sold out, not found):
// by default it is not stored, so the retry after a restock buys. A route
// may keep them (StoreClientErrors, or store_client_errors in a policy
// file), as Stripe does; 408, 425 and 429 are never kept.
func TestIdempotent_HandlerClientErrorsAreStoredOnlyWhereTheRouteSaysSo(t *testing.T) {
	srv := testenv.Redis(t)
	var stock, runs atomic.Int32
	sell := func(c *gin.Context) {
		runs.Add(1)
		if stock.Load() == 0 {
			c.JSON(409, gin.H{"error": "sold_out"})
			return
		}
		stock.Add(-1)
		c.JSON(201, gin.H{"order": runs.Load()})
	}
	pol, err := guard.ParsePolicies("test.yaml", []byte(`
routes:
  - route: POST /file/keep
    idempotency: {unscoped: true, store_client_errors: true}
  - route: POST /file/default
    idempotency: {unscoped: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/default", g.Idempotent(guard.Unscoped()), sell)
		r.POST("/keep", g.Idempotent(guard.Unscoped(), guard.StoreClientErrors()), sell)
		r.POST("/busy", g.Idempotent(guard.Unscoped(), guard.StoreClientErrors()), func(c *gin.Context) {
			runs.Add(1)
			c.JSON(429, gin.H{"error": "slow_down"})
		})
		r.Group("/file", g.Policies(pol)).POST("/keep", sell).POST("/default", sell)
	})
	for _, tc := range []struct {
		path string
		keep bool
	}{{"/default", false}, {"/keep", true}, {"/file/default", false}, {"/file/keep", true}} {
		stock.Store(0)
		key := "k" + strings.ReplaceAll(tc.path, "/", "-")
		if r := do(t, "POST", in.srv.URL+tc.path, `{}`, "Idempotency-Key", key); r.status != 409 {
			t.Fatalf("%s: sold out: %d %s", tc.path, r.status, r.body)
		}
		stock.Store(1) // restocked
		r := do(t, "POST", in.srv.URL+tc.path, `{}`, "Idempotency-Key", key)
		switch {
		case tc.keep && (r.status != 409 || r.header.Get(guard.ReplayedHeader) != "true"):
			t.Errorf("%s keeps 4xx answers: the retry got %d %s, want the 409 replayed", tc.path, r.status, r.body)
		case !tc.keep && (r.status != 201 || r.header.Get(guard.ReplayedHeader) != ""):
			t.Errorf("%s: the retry after the restock got %d %s (replayed %q), want it to buy", tc.path, r.status, r.body, r.header.Get(guard.ReplayedHeader))
		}
	}
	before := runs.Load()
	do(t, "POST", in.srv.URL+"/busy", `{}`, "Idempotency-Key", "k-busy")
	do(t, "POST", in.srv.URL+"/busy", `{}`, "Idempotency-Key", "k-busy")
	if runs.Load() != before+2 {
		t.Errorf("a 429 was stored although it says to try again")
	}
}

// A route that sets no InProgressLease gives its keys the lease of the
// Guard's lock watchdog (lock.WithWatchdogTimeout): a key of an instance that
// died is free again as soon as that instance's locks are.
func TestIdempotent_InProgressLeaseFollowsTheWatchdogTimeout(t *testing.T) {
	srv := testenv.Redis(t)
	stuck := make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser)
		r.POST("/pay", g.Idempotent(guard.Scope("<ctx:user_id>")), func(c *gin.Context) { <-stuck })
	}, guard.WithLockOptions(lock.WithWatchdogTimeout(600*time.Millisecond)))
	if got := in.g.Locks().WatchdogTimeout(); got != 600*time.Millisecond {
		t.Fatalf("the lock Client's watchdog timeout is %v, want 600ms", got)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		do(t, "POST", in.srv.URL+"/pay", "", "Idempotency-Key", "k", "X-User-ID", "u1")
	}()
	defer func() { close(stuck); <-done }()
	var keys []string
	eventually(t, func() bool {
		keys, _ = in.rdb.Keys(context.Background(), "seckillguard:idem:*:r").Result()
		return len(keys) == 1
	})
	ttl, err := in.rdb.PTTL(context.Background(), keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > 600*time.Millisecond {
		t.Fatalf("the in-progress key lives %v, want at most the watchdog timeout 600ms", ttl)
	}
}

// A request holds its key until its record is settled, also when its client
// goes away while the handler runs: a client that gives up and retries with
// the same key must not run the handler a second time beside the first,
// which may still commit. The retry is answered 409 (after WaitForFirst, on
// a route that waits), and once the first is done, replayed its answer.
// On a route that WaitForFirst the key is held by a semaphore permit, which
// used to end with the client's request: the retry took the key over and
// ran.
func TestIdempotent_AKeyStaysClaimedWhenTheClientGoesAway(t *testing.T) {
	srv := testenv.Redis(t)
	for name, opts := range map[string][]guard.RouteOption{
		"in-progress marker": nil,
		"WaitForFirst":       {guard.WaitForFirst(300 * time.Millisecond)},
	} {
		key := "gone-" + strings.ReplaceAll(name, " ", "-")
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int32
			gone, release := make(chan struct{}), make(chan struct{})
			finished := make(chan struct{})
			in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
				r.POST("/pay", g.Idempotent(append([]guard.RouteOption{guard.Unscoped()}, opts...)...), func(c *gin.Context) {
					defer func() {
						if recover() != nil {
							t.Error("handler panicked")
						}
					}()
					if runs.Add(1) == 1 {
						defer close(finished)
						<-c.Request.Context().Done() // its client went away
						close(gone)
						<-release // its work goes on, as a commit already sent does
					}
					c.JSON(http.StatusCreated, gin.H{"run": runs.Load()})
				})
			})
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, in.srv.URL+"/pay", strings.NewReader(`{}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			errc := make(chan error, 1)
			go func() {
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			eventually(t, func() bool { return runs.Load() == 1 })
			cancel()
			<-errc
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatal("the server did not see the client go away")
			}
			r := do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", key)
			if r.status != http.StatusConflict || r.errorCode() != "request_in_progress" || runs.Load() != 1 {
				t.Errorf("retry while the first still runs: %d %s (runs %d); want 409 request_in_progress and one run", r.status, r.body, runs.Load())
			}
			close(release)
			<-finished
			eventually(t, func() bool {
				r = do(t, "POST", in.srv.URL+"/pay", `{}`, "Idempotency-Key", key)
				return r.header.Get(guard.ReplayedHeader) == "true"
			})
			if r.status != http.StatusCreated || string(r.body) != `{"run":1}` || runs.Load() != 1 {
				t.Errorf("retry after the first: %d %s (runs %d); want its 201 replayed", r.status, r.body, runs.Load())
			}
		})
	}
}

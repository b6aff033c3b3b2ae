package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// env returns a getenv over vars.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// embedded returns embedded backends: miniredis and SQLite in memory.
func embedded(t *testing.T) *Backends {
	t.Helper()
	b, err := OpenBackends(env(nil), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// realServers returns backends on a redis-server of the test and a fresh MariaDB
// database.
func realServers(t *testing.T) (*Backends, *testenv.RedisServer) {
	t.Helper()
	rs := testenv.Redis(t)
	b, err := OpenBackends(env(map[string]string{
		envRedisURL: "redis://" + rs.Addr,
		envMySQLDSN: testenv.MySQL(t),
	}), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	b.Quiet()
	return b, rs
}

// builtinPolicies returns the policies of guard.yaml.
func builtinPolicies(t *testing.T) *guard.Policies {
	t.Helper()
	p, _, err := (&knobs{}).loadPolicies()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig returns an instance configuration for mode with the built-in
// policies and no pause.
func testConfig(t *testing.T, mode Mode) Config {
	return Config{
		Mode: mode, Policies: builtinPolicies(t), Lease: time.Second, HoldRate: 1,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError})),
	}
}

// testWriter sends log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// cluster starts n instances of cfg on b, the schema created first, and
// stops them when the test ends. It returns the instances and a pool of
// the test on the database.
func cluster(t *testing.T, b *Backends, cfg Config, n int) ([]*instance, *gorm.DB) {
	t.Helper()
	ctx := context.Background()
	db, err := b.OpenDB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeDB(db) })
	if err := migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	var out []*instance
	for range n {
		in, err := startInstance(ctx, b, cfg, "127.0.0.1:0", false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(in.stop)
		out = append(out, in)
	}
	return out, db
}

// answer is an HTTP answer of the service.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// code returns the "error" field of the answer's body.
func (a answer) code() string {
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(a.body, &e)
	return e.Error
}

func (a answer) order(t *testing.T) Order {
	t.Helper()
	var o Order
	if err := json.Unmarshal(a.body, &o); err != nil || o.ID == 0 {
		t.Fatalf("answer %d %s is no order (%v)", a.status, a.body, err)
	}
	return o
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(string(a.body)))
}

// do sends a request with headers given as name, value pairs.
func do(t *testing.T, method, url, body string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: data}
}

// buyAt sends a purchase of sku by user, with an Idempotency-Key unless key
// is "".
func buyAt(t *testing.T, in *instance, sku, user, key string) answer {
	t.Helper()
	headers := []string{"X-User-ID", user}
	if key != "" {
		headers = append(headers, "Idempotency-Key", key)
	}
	return do(t, http.MethodPost, in.url+"/api/seckill/"+sku, "", headers...)
}

// putProduct creates or resets sku with stock units. With a short fixed
// lease (guard-lease) a slow reset may lose its lock and be refused; it is
// sent again then.
func putProduct(t *testing.T, in *instance, sku string, stock int) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		a := do(t, http.MethodPost, in.url+"/api/admin/products", fmt.Sprintf(`{"sku":%q,"name":"test","stock":%d,"price":100}`, sku, stock))
		switch {
		case a.status == http.StatusCreated || a.status == http.StatusOK:
			return
		case attempt < 5 && (a.code() == "stale_write" || a.code() == "lock_lost"):
			continue
		}
		t.Fatalf("put %s: %v", sku, a)
	}
}

// stockOf reads the SKU's stock from the database.
func stockOf(t *testing.T, db *gorm.DB, sku string) int {
	t.Helper()
	var p Product
	if err := db.Where("sku = ?", sku).Take(&p).Error; err != nil {
		t.Fatal(err)
	}
	return p.Stock
}

// ordersOf reads the SKU's orders from the database.
func ordersOf(t *testing.T, db *gorm.DB, sku string) []Order {
	t.Helper()
	var orders []Order
	if err := db.Where("sku = ?", sku).Order("id").Find(&orders).Error; err != nil {
		t.Fatal(err)
	}
	return orders
}

// counter reads a counter of the instance's registry.
func counter(in *instance, name, label, value string) float64 {
	return counterValue(in.svc.Registry(), name, label, value)
}

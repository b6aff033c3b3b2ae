package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// startServe runs the serve command as main does, with vars as its
// environment, and returns its banner (the lines it prints once it listens)
// and base URL. The command
// stops, and must end without error, when the test ends.
func startServe(t *testing.T, vars map[string]string, args ...string) (line, url string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...), env(vars), pw, io.Discard)
		pw.Close()
	}()
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(pr)
		lines <- readBanner(r)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case line = <-lines:
	case err := <-done:
		cancel()
		t.Fatalf("serve ended before it served: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("serve printed no startup line")
	}
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve ended with %v", err)
		}
	})
	first, _, _ := strings.Cut(line, "\n")
	m := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(first)
	if m == nil {
		t.Fatalf("first line %q names no address", first)
	}
	return line, "http://" + m[1]
}

// readBanner reads the bannerLines lines serve prints once it listens.
func readBanner(r *bufio.Reader) string {
	var b strings.Builder
	for range bannerLines {
		l, err := r.ReadString('\n')
		b.WriteString(l)
		if err != nil {
			break
		}
	}
	return b.String()
}

// TestServe_EmbeddedDefaultStartsAndSells is "go run ./example-seckill" on
// a machine with only Go: no REDIS_URL, no MYSQL_DSN.
func TestServe_EmbeddedDefaultStartsAndSells(t *testing.T) {
	t.Parallel()
	banner, url := startServe(t, nil)
	for _, want := range []string{"mode guard\n", "Redis:    embedded miniredis", "database: embedded SQLite in memory", "policies: guard.yaml (built in)",
		"try:      curl -X POST -H 'X-User-ID: u1' " + strings.TrimPrefix(url, "http://") + "/api/seckill/" + demoSKU} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner does not say %q:\n%s", want, banner)
		}
	}
	wantFits(t, banner)
	if first, _, _ := strings.Cut(banner, "\n"); len(first) > 60 {
		t.Errorf("first line of %d columns, want a short one: %q", len(first), first)
	}
	in := &instance{url: url}
	if a := buyAt(t, in, demoSKU, "u1", ""); a.status != http.StatusCreated || a.order(t).SKU != demoSKU {
		t.Fatalf("buy: %v", a)
	}
	if a := buyAt(t, in, demoSKU, "u1", ""); a.status != http.StatusConflict || a.code() != "already_purchased" {
		t.Errorf("buy again: %v", a)
	}
	if a := do(t, http.MethodGet, url+"/api/products/"+demoSKU, ""); !strings.Contains(string(a.body), `"stock":99`) {
		t.Errorf("product after one sale: %v", a)
	}
	if a := do(t, http.MethodGet, url+"/healthz", ""); a.status != http.StatusOK {
		t.Errorf("healthz: %v", a)
	}
	metrics := string(do(t, http.MethodGet, url+"/metrics", "").body)
	for _, want := range []string{
		"seckill_orders_total 1",
		`seckillguard_lock_acquired_total{method="POST",route="/api/seckill/:sku"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestServe_PoliciesFlagReplacesTheBuiltInFile runs on a real Redis (and
// embedded SQLite) so that the test can hold the lock from outside.
func TestServe_PoliciesFlagReplacesTheBuiltInFile(t *testing.T) {
	t.Parallel()
	rs := testenv.Redis(t)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	policy := "routes:\n  - route: POST /api/seckill/:sku\n    lock: \"sku:<sku>\"\n    wait: 0s\n    busy_error: try_later\n"
	if err := os.WriteFile(file, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	line, url := startServe(t, map[string]string{envRedisURL: "redis://" + rs.Addr}, "-policies", file)
	if !strings.Contains(line, "policies: "+file) || !strings.Contains(line, "Redis:    127.0.0.1") {
		t.Errorf("banner does not name the policy file and the Redis:\n%s", line)
	}

	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.Mutex("sku:" + demoSKU)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := buyAt(t, &instance{url: url}, demoSKU, "u1", "")
	if a.status != http.StatusTooManyRequests || a.code() != "try_later" {
		t.Errorf("buy while the lock is held elsewhere: %v, want the file's 429 try_later", a)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("answered after %v; the file says wait: 0s", d)
	}
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	if a := buyAt(t, &instance{url: url}, demoSKU, "u1", ""); a.status != http.StatusCreated {
		t.Errorf("buy once the lock is free: %v", a)
	}
}

func TestServe_RefusesNonsense(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stray := filepath.Join(dir, "stray.yaml")
	if err := os.WriteFile(stray, []byte("routes:\n  - route: POST /api/seckill/:sku\n    lock: \"sku:<sku>\"\n  - route: DELETE /api/orders/:id\n    lock: \"order:<id>\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mode", "mutex"}, "unknown mode"},
		{[]string{"-hold-rate", "0"}, "-hold-rate"},
		{[]string{"-hold-delay", "-1s"}, "-hold-delay"},
		{[]string{"-watchdog", "1ms"}, "-watchdog"},
		{[]string{"-policies", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"-policies", stray}, "DELETE /api/orders/:id"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		err := run(context.Background(), append([]string{"serve", "-addr", "127.0.0.1:0"}, tc.args...), env(nil), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %q: err = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
	if err := run(context.Background(), []string{"sell"}, env(nil), io.Discard, io.Discard); err == nil {
		t.Error("an unknown command ran")
	}
	if err := run(context.Background(), []string{"serve", "-addr", "127.0.0.1:0"}, env(map[string]string{envMySQLDSN: "root@tcp(127.0.0.1:3306)/"}), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "names no database") {
		t.Errorf("MYSQL_DSN without a database: err = %v", err)
	}
}

// TestServe_SQLiteFileKeepsTheSale: with -sqlite the embedded database
// outlives the process.
func TestServe_SQLiteFileKeepsTheSale(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "seckill.db")
	for i, want := range []string{`"stock":99`, `"stock":98`} {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, []string{"serve", "-addr", "127.0.0.1:0", "-sqlite", file}, env(nil), pw, io.Discard)
			pw.Close()
		}()
		r := bufio.NewReader(pr)
		line := readBanner(r)
		go io.Copy(io.Discard, r)
		m := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, file) {
			cancel()
			t.Fatalf("banner:\n%s", line)
		}
		in := &instance{url: "http://" + m[1]}
		if a := buyAt(t, in, demoSKU, "u"+string(rune('1'+i)), ""); a.status != http.StatusCreated {
			t.Errorf("run %d: buy: %v", i+1, a)
		}
		if a := do(t, http.MethodGet, in.url+"/api/products/"+demoSKU, ""); !strings.Contains(string(a.body), want) {
			t.Errorf("run %d: product %v, want %s", i+1, a, want)
		}
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

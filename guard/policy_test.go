package guard_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

func TestPolicies_FileDrivesThreeBehaviours(t *testing.T) {
	pol, err := guard.LoadPolicies("testdata/guard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.Redis(t)
	release := make(chan struct{})
	var pays, orders atomic.Int32
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(withUser, g.Policies(pol))
		r.POST("/api/seckill/:sku", func(c *gin.Context) {
			if c.Query("hold") != "" {
				<-release
			}
			c.JSON(200, gin.H{"key": guard.Key(c)})
		})
		r.POST("/api/pay", func(c *gin.Context) { c.Header("Location", "/p/1"); c.JSON(201, gin.H{"n": pays.Add(1)}) })
		r.POST("/api/orders/:order", func(c *gin.Context) { c.JSON(201, gin.H{"n": orders.Add(1), "key": guard.Key(c)}) })
		r.GET("/free", func(c *gin.Context) { c.String(200, "untouched") })
		if left := pol.Unmatched(r.Routes()); len(left) != 0 {
			t.Errorf("policies without a route: %v", left)
		}
	})
	url := in.srv.URL

	// 1. The lock, with its fast busy answer and custom code.
	held := make(chan reply)
	go func() { held <- do(t, "POST", url+"/api/seckill/s1?hold=1", "") }()
	eventually(t, func() bool { n, _ := in.rdb.Exists(context.Background(), "sku:s1").Result(); return n == 1 })
	start := time.Now()
	if r := do(t, "POST", url+"/api/seckill/s1", ""); r.status != 429 || r.errorCode() != "sold_out_or_busy" || time.Since(start) > time.Second {
		t.Errorf("seckill busy: %d %s after %v", r.status, r.body, time.Since(start))
	}
	close(release)
	if r := <-held; r.status != 200 || !strings.Contains(string(r.body), "sku:s1") {
		t.Errorf("seckill: %d %s", r.status, r.body)
	}

	// 2. Idempotency with a header key and replayed headers.
	h := []string{"Idempotency-Key", "p-1", "X-User-ID", "u1"}
	a, b := do(t, "POST", url+"/api/pay", `{}`, h...), do(t, "POST", url+"/api/pay", `{}`, h...)
	if pays.Load() != 1 || b.header.Get("Location") != "/p/1" || b.header.Get("Idempotent-Replayed") != "true" || string(a.body) != string(b.body) {
		t.Errorf("pay: runs %d, replay %d %v %s", pays.Load(), b.status, b.header, b.body)
	}

	// 3. Both: a key from the body, then the lock.
	for i := 0; i < 2; i++ {
		if r := do(t, "POST", url+"/api/orders/o9", `{"nonce":"n1"}`, "X-User-ID", "u2"); r.status != 201 || !strings.Contains(string(r.body), `"key":"order:o9"`) {
			t.Errorf("orders %d: %d %s", i, r.status, r.body)
		}
	}
	if orders.Load() != 1 {
		t.Errorf("orders ran %d times for one body key", orders.Load())
	}
	if r := do(t, "GET", url+"/free", ""); r.status != 200 {
		t.Errorf("a route without a policy: %d", r.status)
	}
}

func TestPolicies_BadFilesNameTheLine(t *testing.T) {
	cases := map[string]struct{ yaml, want string }{
		"unknown field":             {"routes:\n  - route: POST /a\n    lock: x\n    wiat: 2s\n", `line 4: unknown field "wiat"`},
		"unknown idempotency field": {"routes:\n  - route: POST /a\n    idempotency:\n      scope: x\n      ttl2: 1h\n", `line 5: unknown field "ttl2"`},
		"unknown default":           {"defaults:\n  busy: 1\nroutes: []\n", `line 2: unknown field "busy"`},
		"bad duration":              {"routes:\n  - route: POST /a\n    lock: x\n    wait: 2 seconds\n", `line 4: bad duration "2 seconds"`},
		"negative wait":             {"routes:\n  - route: POST /a\n    lock: x\n    wait: -1s\n", "line 4: guard: invalid route option: Wait(-1s)"},
		"bad template":              {"routes:\n  - route: POST /a\n    lock: \"sku:<id\"\n", `line 3: lock: ginmw: template "sku:<id" column 5`},
		"path field not in route":   {"routes:\n  - route: POST /a/:id\n    lock: \"sku:<path:sku>\"\n", "line 3: lock: ginmw:"},
		"bad scope":                 {"routes:\n  - route: POST /a\n    idempotency:\n      scope: \"<ctx:>\"\n", "line 4: idempotency scope: ginmw: template"},
		"duplicate route":           {"routes:\n  - route: POST /a\n    lock: x\n  - route: POST /a\n    lock: y\n", `line 4: route "POST /a" is already defined at line 2`},
		"bad route":                 {"routes:\n  - route: /a\n    lock: x\n", `line 2: route "/a": want "METHOD /path"`},
		"lower method":              {"routes:\n  - route: post /a\n    lock: x\n", `line 2: route "post /a"`},
		"nothing to do":             {"routes:\n  - route: GET /a\n    wait: 1s\n", "line 2: route \"GET /a\" has neither lock nor idempotency"},
		"bad fail":                  {"routes:\n  - route: POST /a\n    lock: x\n    fail: maybe\n", `line 4: fail: "maybe", want open or closed`},
		"no scope":                  {"routes:\n  - route: POST /a\n    idempotency:\n      ttl: 1h\n", "line 4: idempotency needs a scope"},
		"bad status":                {"routes:\n  - route: POST /a\n    lock: x\n    busy_status: 200\n", "line 4: busy_status 200: the status must be 4xx or 5xx"},
		"wrong type":                {"routes:\n  - route: POST /a\n    lock: x\n    body_limit: lots\n", "line 4:"},
		"not a list":                {"routes:\n  route: POST /a\n", "line 2:"},
		"not yaml":                  {"routes: [\n", "guard: t.yaml:"},
		"empty":                     {"", "empty policy file"},
		"bad fingerprint":           {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      fingerprint: [\"a..b\"]\n", "line 5: idempotency fingerprint"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := guard.ParsePolicies("t.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "guard: t.yaml: ") {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := guard.LoadPolicies("testdata/missing.yaml"); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestPolicies_UnmatchedNamesTheLine(t *testing.T) {
	pol, err := guard.ParsePolicies("p.yaml", []byte("routes:\n  - route: POST /a/:id\n    lock: a\n  - route: POST /typo\n    lock: b\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/a/:id", func(*gin.Context) {})
	if got := pol.Unmatched(r.Routes()); len(got) != 1 || got[0] != "POST /typo (line 4)" {
		t.Fatalf("Unmatched = %v", got)
	}
}

func FuzzParsePolicies(f *testing.F) {
	for _, s := range []string{
		"routes:\n  - route: POST /a\n    lock: \"sku:<id>\"\n    wait: 1s\n",
		"defaults:\n  fail: open\nroutes:\n  - route: GET /x\n    idempotency:\n      scope: \"<ctx:u>\"\n      fingerprint: [a, b.c]\n",
		"routes: [{route: 'PUT /y', lock: '{t}:<path:id>', lease: 5s, busy_status: 503}]",
		"&a [*a]", "routes:\n  - !!binary x\n", "\t\n",
		// The refusals: scope with unscoped, duplicates but for spaces, a
		// second document, a header no request carries, a path with a
		// space, a body limit beyond what can be buffered.
		"routes:\n  - route: POST /a\n    idempotency:\n      scope: \"<ctx:u>\"\n      unscoped: true\n",
		"routes:\n  - route: POST /a\n    lock: x\n  - route: \" POST\t /a\"\n    lock: y\n",
		"routes:\n  - route: POST /a\n    lock: x\n---\nroutes: []\n",
		"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      header: \"Idem Key\"\n      replay_headers: [\"X:\"]\n",
		"routes:\n  - route: POST /a b\n    lock: x\n",
		"defaults:\n  body_limit: 9223372036854775807\nroutes:\n  - route: POST /a\n    lock: x\n    body_limit: 1073741824\n",
	} {
		f.Add([]byte(s))
	}
	// A Guard on a client that is never used: New and Policies do no I/O.
	g := guard.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), guard.WithLogger(quiet))
	defer g.Close()
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := guard.ParsePolicies("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "guard: f.yaml: ") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, rp := range p.Routes() {
			route := rp.Method + " " + rp.Path
			if rp.Method == "" || !strings.HasPrefix(rp.Path, "/") || rp.Line <= 0 || strings.ContainsAny(route[len(rp.Method)+1:], " \t\r\n") {
				t.Fatalf("accepted route %+v", rp)
			}
			if seen[route] {
				t.Fatalf("accepted %q twice", route)
			}
			seen[route] = true
		}
		// Every value was checked at load: the middleware is built without
		// a panic.
		g.Policies(p)
		// A second document is never ignored.
		if _, err := guard.ParsePolicies("f.yaml", append(append([]byte(nil), data...), "\n---\nroutes: []\n"...)); err == nil {
			t.Fatal("a second document was accepted")
		}
	})
}

func TestPolicies_RouteLeaseZeroRestoresTheWatchdog(t *testing.T) {
	pol, err := guard.ParsePolicies("p.yaml", []byte("defaults:\n  lease: 50ms\nroutes:\n  - route: POST /slow/:id\n    lock: \"s:<id>\"\n    lease: 0s\n  - route: POST /fast/:id\n    lock: \"f:<id>\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rp := pol.Routes()[0]; rp.LockTemplate() != "s:<id>" || rp.Idempotent() {
		t.Fatalf("route policy %q %v", rp.LockTemplate(), rp.Idempotent())
	}
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Policies(pol))
		slow := func(c *gin.Context) {
			select {
			case <-c.Request.Context().Done():
			case <-time.After(200 * time.Millisecond):
				c.Status(204)
			}
		}
		r.POST("/slow/:id", slow)
		r.POST("/fast/:id", slow)
	})
	if r := do(t, "POST", in.srv.URL+"/slow/1", ""); r.status != 204 {
		t.Errorf("lease: 0s must mean the watchdog: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", in.srv.URL+"/fast/1", ""); r.status != 409 || r.errorCode() != "lock_lost" {
		t.Errorf("the default 50ms lease: %d %s", r.status, r.body)
	}
}

func TestPolicies_BusyStatusAndCodeAreInheritedApart(t *testing.T) {
	pol, err := guard.ParsePolicies("p.yaml", []byte("defaults:\n  busy_status: 503\nroutes:\n  - route: POST /a/:id\n    lock: \"a:<id>\"\n    wait: 0s\n    busy_error: sold_out\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.Redis(t)
	release := make(chan struct{})
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Policies(pol))
		r.POST("/a/:id", func(c *gin.Context) {
			if c.Query("hold") != "" {
				<-release
			}
			c.Status(204)
		})
	})
	held := make(chan reply)
	go func() { held <- do(t, "POST", in.srv.URL+"/a/1?hold=1", "") }()
	eventually(t, func() bool { n, _ := in.rdb.Exists(context.Background(), "a:1").Result(); return n == 1 })
	if r := do(t, "POST", in.srv.URL+"/a/1", ""); r.status != 503 || r.errorCode() != "sold_out" {
		t.Errorf("busy: %d %s, want the default's 503 with the route's sold_out", r.status, r.body)
	}
	close(release)
	<-held
}

func TestPolicies_RefusedWithTheLine(t *testing.T) {
	cases := map[string]struct{ yaml, want string }{
		"scope and unscoped": {"routes:\n  - route: POST /a\n    idempotency:\n      scope: \"<ctx:user_id>\"\n      unscoped: true\n",
			"line 5: idempotency: scope (line 4) and unscoped: true contradict each other"},
		"unscoped before scope": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      scope: \"<ctx:user_id>\"\n",
			"line 4: idempotency: scope (line 5) and unscoped: true"},
		"duplicate but for spaces": {"routes:\n  - route: POST /a\n    lock: x\n  - route: \"POST   /a \"\n    lock: y\n",
			`line 4: route "POST /a" is already defined at line 2`},
		"duplicate but for a tab": {"routes:\n  - route: POST /a\n    lock: x\n  - route: \"POST\\t/a\"\n    lock: y\n",
			`line 4: route "POST /a" is already defined at line 2`},
		"second document": {"routes:\n  - route: POST /a\n    lock: x\n---\nroutes:\n  - route: POST /b\n    lock: y\n",
			"line 4: a second YAML document"},
		"empty second document": {"routes:\n  - route: POST /a\n    lock: x\n---\n", "line 4: a second YAML document"},
		"header with a space": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      header: \"Idem Key\"\n",
			`line 5: guard: invalid route option: IdempotencyHeader("Idem Key")`},
		"replay header with a colon": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      replay_headers: [\"Location:\"]\n",
			"line 5: guard: invalid route option: ReplayHeaders"},
		"path with a space": {"routes:\n  - route: POST /a b\n    lock: x\n", `line 2: route "POST /a b": the path has a space`},
		"body limit beyond allocation": {"routes:\n  - route: POST /a\n    lock: x\n    body_limit: 9223372036854775807\n",
			"line 4: guard: invalid route option: BodyLimit(9223372036854775807)"},
		"lock field the route lacks": {"routes:\n  - route: POST /orders\n    lock: \"order:<order_id>\"\n",
			`line 3: lock: template "order:<order_id>" takes a path parameter route "/orders" does not have`},
		"default body limit beyond allocation": {"defaults:\n  body_limit: 2147483648\nroutes:\n  - route: POST /a\n    lock: x\n",
			"line 2: guard: invalid route option: BodyLimit(2147483648)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := guard.ParsePolicies("t.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "guard: t.yaml: ") {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// Method and path are kept normalised.
	p, err := guard.ParsePolicies("t.yaml", []byte("routes:\n  - route: \"  POST \\t /a/:id  \"\n    lock: x\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rp := p.Routes()[0]; rp.Method != "POST" || rp.Path != "/a/:id" {
		t.Fatalf("route read as %q %q", rp.Method, rp.Path)
	}
}

// Settings of one idempotency block that contradict each other are refused
// with their lines: the key from a header and from a template (the last
// applied used to win), and an in-progress lease on a route that waits for
// the first request (which holds its key by a semaphore permit, and used to
// drop the lease silently).
func TestPolicies_ContradictoryIdempotencySettingsAreRefusedWithTheLine(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"header and key": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      header: X-Key\n      key: \"k:<body:n>\"\n",
			"line 6: idempotency: header (line 5) and key (line 6) contradict each other"},
		"key and header": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      key: \"k:<body:n>\"\n      header: X-Key\n",
			"line 6: idempotency: header (line 6) and key (line 5) contradict each other"},
		"lease and wait": {"routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      in_progress_lease: 5s\n      wait_for_first: 2s\n",
			"line 6: idempotency: in_progress_lease (line 5) does nothing with wait_for_first (line 6)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := guard.ParsePolicies("t.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// A wait of 0 waits for nothing: the lease is used.
	if _, err := guard.ParsePolicies("t.yaml", []byte("routes:\n  - route: POST /a\n    idempotency:\n      unscoped: true\n      in_progress_lease: 5s\n      wait_for_first: 0s\n")); err != nil {
		t.Errorf("in_progress_lease with wait_for_first: 0s: %v", err)
	}
}

// A lock setting on a route that takes no lock would do nothing: the file
// refuses it with its line, as Policies.With refuses the option. Defaults
// may set lock settings for every route; a route whose lock comes from the
// defaults takes them.
func TestPolicies_LockSettingsWithoutALockAreRefusedWithTheLine(t *testing.T) {
	idem := "    idempotency:\n      unscoped: true\n"
	for name, tc := range map[string]struct{ yaml, want string }{
		"wait":        {"routes:\n  - route: POST /a\n    wait: 1s\n" + idem, "line 3: wait: the route takes no lock"},
		"lease":       {"routes:\n  - route: POST /a\n" + idem + "    lease: 5s\n", "line 5: lease: the route takes no lock"},
		"lease 0":     {"routes:\n  - route: POST /a\n" + idem + "    lease: 0s\n", "line 5: lease: the route takes no lock"},
		"busy_status": {"routes:\n  - route: POST /a\n    busy_status: 503\n" + idem, "line 3: busy_status: the route takes no lock"},
		"busy_error":  {"routes:\n  - route: POST /a\n    busy_error: full\n" + idem, "line 3: busy_error: the route takes no lock"},
		"long_hold":   {"routes:\n  - route: POST /a\n    long_hold: 2s\n" + idem, "line 3: long_hold: the route takes no lock"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := guard.ParsePolicies("t.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "guard: t.yaml: ") {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	for name, yaml := range map[string]string{
		"in the defaults":           "defaults:\n  wait: 1s\n  lease: 5s\n  busy_status: 503\n  long_hold: 2s\nroutes:\n  - route: POST /a\n" + idem,
		"with the lock":             "routes:\n  - route: POST /a/:id\n    lock: \"x:<id>\"\n    wait: 1s\n    lease: 0s\n    busy_error: full\n",
		"with the defaults' lock":   "defaults:\n  lock: \"x:<query:id>\"\nroutes:\n  - route: POST /a\n    wait: 1s\n",
		"both kinds on a lock-less": "routes:\n  - route: POST /a\n    retry_after: 2s\n    fail: open\n    body_limit: 100\n" + idem,
	} {
		if _, err := guard.ParsePolicies("t.yaml", []byte(yaml)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Policies.With refuses an option exactly where it would do nothing, as
// Lock and Idempotent do: an idempotency option on a route without
// idempotency, a lock option on a route without a lock. It used to refuse
// every option on a route without a lock (StoreClientErrors on an
// idempotency-only route) and accept idempotency options on a lock-only
// route, where they did nothing.
func TestPolicies_WithRefusesAnOptionExactlyWhereItDoesNothing(t *testing.T) {
	pol, err := guard.ParsePolicies("test.yaml", []byte(`
routes:
  - route: POST /lock/:sku
    lock: "w:<sku>"
  - route: POST /idem
    idempotency:
      unscoped: true
  - route: POST /both/:sku
    lock: "w:<sku>"
    idempotency:
      unscoped: true
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		route string
		opt   guard.RouteOption
		want  string // "" for accepted
	}{
		{"POST /idem", guard.StoreClientErrors(), ""},
		{"POST /idem", guard.RetryAfter(time.Second), ""},
		{"POST /idem", guard.Wait(time.Second), "the route takes no lock (line 5)"},
		{"POST /idem", guard.Combining(&countSession{}), "the route takes no lock"},
		{"POST /lock/:sku", guard.StoreClientErrors(), "the route has no idempotency (line 3)"},
		{"POST /lock/:sku", guard.RecordTTL(time.Hour), "the route has no idempotency"},
		{"POST /lock/:sku", guard.Combining(&countSession{}), ""},
		{"POST /lock/:sku", guard.MaxBatch(4), "do nothing without it"},
		{"POST /both/:sku", guard.StoreClientErrors(), ""},
		{"POST /both/:sku", guard.Wait(time.Second), ""},
	} {
		_, err := pol.With(tc.route, tc.opt)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("With(%q, ...): %v; want it accepted", tc.route, err)
		case tc.want != "" && (err == nil || !errors.Is(err, guard.ErrBadOption) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("With(%q, ...): %v; want ErrBadOption saying %q", tc.route, err, tc.want)
		}
	}

	// StoreClientErrors given through With does what it says.
	with, err := pol.With("POST /idem", guard.StoreClientErrors())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	in := newInstance(t, testenv.Redis(t), func(g *guard.Guard, r *gin.Engine) {
		r.Use(g.Policies(with))
		r.POST("/idem", func(c *gin.Context) { runs.Add(1); c.JSON(http.StatusConflict, gin.H{"error": "sold_out"}) })
	})
	for range 2 {
		do(t, "POST", in.srv.URL+"/idem", "", "Idempotency-Key", "k")
	}
	if runs.Load() != 1 {
		t.Errorf("the handler ran %d times; want its 409 stored and replayed (StoreClientErrors)", runs.Load())
	}
}

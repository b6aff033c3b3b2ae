package reliability

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
)

// hostileRequest builds the request FuzzHostile_NoKeyFromAnUnsafeValue
// sends: where picks the route and the place of value; body and key are the
// raw body and Idempotency-Key of the routes that take them.
func hostileRequest(where uint8, value string, body []byte, key string) *http.Request {
	switch where % 6 {
	case 0:
		return post("/lock/"+url.PathEscape(value), "", "")
	case 1:
		return post("/query?sku="+url.QueryEscape(value), "", "")
	case 2:
		req := post("/header", "", "")
		req.Header["X-User"] = []string{value}
		return req
	case 3:
		return post("/body", "application/json", `{"order":{"sku":`+jsonText(value)+`}}`)
	case 4:
		return post("/body", "application/json", string(body))
	default:
		req := post("/pay", "application/json", string(body))
		req.Header["X-User"] = []string{value}
		req.Header["Idempotency-Key"] = []string{key}
		return req
	}
}

// Whatever a request carries, the middleware answers it without a panic or
// a 5xx; a 4xx creates no Redis key and does not run the handler; a 2xx
// leaves only keys of the expected shapes, free of control characters and
// of braces other than the framework's own.
func FuzzHostile_NoKeyFromAnUnsafeValue(f *testing.F) {
	for _, v := range unsafeValues {
		if len(v) > 1024 {
			v = v[:1024]
		}
		for where := range uint8(6) {
			f.Add(where, v, []byte(`{"order":{"sku":"s1"}}`), "k1")
		}
	}
	for _, v := range globValues {
		f.Add(uint8(0), v, []byte(`{}`), v)
	}
	for _, b := range []string{`{"order":{"sku":"s1"`, `[1]`, `{"order":{"sku":{"a":1}}}`, `{"order":{"sku":"\ud800"}}`, "\x00", ``, `{"order":{"sku":"{x}"}}`} {
		f.Add(uint8(4), "v", []byte(b), "k")
	}
	for _, k := range []string{"", "*", `"{a}"`, "a\nb", `"a";p`, strings.Repeat("k", 256)} {
		f.Add(uint8(5), "u1", []byte(`{}`), k)
	}
	s := newHostileService(f)
	f.Fuzz(func(t *testing.T, where uint8, value string, body []byte, key string) {
		if where%6 == 0 && value == "" {
			return // "/lock/" is not a route
		}
		s.reset(t)
		runs := s.runs.Load()
		w := s.serve(hostileRequest(where, value, body, key))
		keys := s.keys(t)
		switch {
		case w.Code >= 500:
			t.Fatalf("%d %s", w.Code, w.Body.String())
		case w.Code >= 400:
			if len(keys) != 0 || s.runs.Load() != runs {
				t.Fatalf("%d %s, yet keys %q and %d handler runs", w.Code, w.Body.String(), keys, s.runs.Load()-runs)
			}
		default:
			for _, k := range keys {
				if !safeKey.MatchString(k) || !utf8.ValidString(k) || strings.ContainsFunc(k, isControl) {
					t.Fatalf("%d, and key %q", w.Code, k)
				}
			}
		}
	})
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 }

// Every policy file the loader accepts installs without a panic (the
// loader reports every mistake as an error naming the line), and the routes
// it guards answer a hostile request without a 5xx and, when they refuse
// it, without creating a Redis key.
func FuzzPolicies_AcceptedFileInstallsAndServes(f *testing.F) {
	for _, p := range []string{
		hostilePolicies,
		"routes:\n  - route: POST /a/:id\n    lock: \"{t}:<path:id>\"\n    wait: 0s\n    lease: 5s\n",
		"defaults:\n  fail: open\n  wait: 0s\nroutes:\n  - route: PUT /x/:k\n    lock: \"k:<k>:<header:X-User>\"\n    body_limit: 16\n",
		"routes:\n  - route: POST /p\n    wait: 0s\n    idempotency:\n      unscoped: true\n      fingerprint: [a, b.c]\n      max_response: 1\n",
		"routes:\n  - route: DELETE /d/:id\n    lock: \"<query:q>-<id>\"\n    busy_status: 503\n    busy_error: x\n    wait: 0s\n",
	} {
		for _, v := range []string{"s1", "{", "a\nb", "*", ""} {
			f.Add([]byte(p), v)
		}
	}
	s := newHostileService(f)
	g := guard.New(s.rdb, guard.WithLogger(quiet))
	f.Cleanup(func() { g.Close() })
	f.Fuzz(func(t *testing.T, data []byte, value string) {
		pol, err := guard.ParsePolicies("f.yaml", data)
		if err != nil {
			return
		}
		var mw gin.HandlerFunc
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Policies panicked on a file the loader accepted: %v\n%s", r, data)
				}
			}()
			mw = g.Policies(pol)
		}()
		r := gin.New()
		r.Use(mw)
		var routes []*guard.RoutePolicy
		for _, rp := range pol.Routes() {
			if registerRoute(r, rp, func(c *gin.Context) { s.runs.Add(1); c.Status(http.StatusOK) }) {
				routes = append(routes, rp)
			}
		}
		for _, rp := range routes {
			s.reset(t)
			runs := s.runs.Load()
			req, err := http.NewRequest(rp.Method, fillPath(rp.Path, value)+"?q="+url.QueryEscape(value)+"&id="+url.QueryEscape(value),
				strings.NewReader(`{"nonce":`+jsonText(value)+`,"a":1}`))
			if err != nil {
				continue // a path no client can send
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header["X-User"] = []string{value}
			req.Header["Idempotency-Key"] = []string{"k1"}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			keys := s.keys(t)
			switch {
			case w.Code >= 500 && w.Code != http.StatusServiceUnavailable:
				t.Fatalf("%s %s: %d %s\n%s", rp.Method, rp.Path, w.Code, w.Body.String(), data)
			case w.Code >= 400 && w.Code != http.StatusNotFound && (len(keys) != 0 || s.runs.Load() != runs):
				t.Fatalf("%s %s: %d, yet keys %q and %d handler runs\n%s", rp.Method, rp.Path, w.Code, keys, s.runs.Load()-runs, data)
			}
		}
	})
}

// registerRoute adds a route for rp to r and reports whether gin took it:
// gin panics on paths it cannot route (conflicts, bad wildcards), which are
// gin's rules, not the policy loader's.
func registerRoute(r *gin.Engine, rp *guard.RoutePolicy, h gin.HandlerFunc) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	r.Handle(rp.Method, rp.Path, h)
	return true
}

// fillPath puts value into every parameter segment of a gin route path.
func fillPath(path, value string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") || strings.HasPrefix(s, "*") {
			segs[i] = url.PathEscape(value)
		}
	}
	return strings.Join(segs, "/")
}

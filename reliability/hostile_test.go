package reliability

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// hostilePolicies guard a route from a policy file: a lock from the path
// and an idempotency key from the body, scoped by a header.
const hostilePolicies = `
routes:
  - route: POST /pol/:sku
    lock: "sku:<sku>"
    wait: 0s
    idempotency:
      scope: "<header:X-User>"
      key: "buy:<sku>:<body:nonce>"
`

// hostileService is a guarded service on a redis-server of its own, so
// that every key a request creates can be listed.
type hostileService struct {
	srv  *testenv.RedisServer
	rdb  *redis.Client
	r    *gin.Engine
	runs atomic.Int64 // handler runs
}

func newHostileService(t testing.TB) *hostileService {
	t.Helper()
	s := &hostileService{srv: testenv.Redis(t)}
	s.rdb = s.srv.Client()
	g := guard.New(s.rdb, guard.WithLogger(quiet), guard.WithLockOptions(lock.WithWatchdogTimeout(3*time.Second)))
	t.Cleanup(func() { g.Close() })
	pol, err := guard.ParsePolicies("hostile.yaml", []byte(hostilePolicies))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(c *gin.Context) { s.runs.Add(1); c.JSON(http.StatusOK, gin.H{"ok": true}) }
	r := gin.New()
	r.Use(g.Policies(pol))
	r.POST("/lock/:sku", g.Lock("sku:<sku>", guard.Wait(0)), ok)
	r.POST("/query", g.Lock("sku:<query:sku>", guard.Wait(0)), ok)
	r.POST("/header", g.Lock("user:<header:X-User>", guard.Wait(0)), ok)
	r.POST("/body", g.Lock("order:<body:order.sku>", guard.Wait(0)), ok)
	r.POST("/big", g.Lock("order:<body:sku>", guard.Wait(0), guard.BodyLimit(4<<20)), ok)
	r.POST("/pay", g.Idempotent(guard.Scope("<header:X-User>")), ok)
	r.POST("/pol/:sku", ok)
	s.r = r
	return s
}

// serve runs req through the engine in process: header values the wire
// would refuse reach the middleware as they are.
func (s *hostileService) serve(req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.r.ServeHTTP(w, req)
	return w
}

// keys lists every key on the server.
func (s *hostileService) keys(t testing.TB) []string {
	t.Helper()
	var all []string
	iter := s.rdb.Scan(t.Context(), 0, "*", 1000).Iterator()
	for iter.Next(t.Context()) {
		all = append(all, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

// reset empties the server.
func (s *hostileService) reset(t testing.TB) {
	t.Helper()
	if err := s.rdb.FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}

// jsonText writes v as a JSON string, escaping quotes, backslashes and
// control characters but leaving every other byte as it is, invalid UTF-8
// included (encoding/json would replace it).
func jsonText(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func post(target, contentType, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req
}

// unsafeValues may never become part of a Redis key.
var unsafeValues = map[string]string{
	"open brace":       "{",
	"close brace":      "}",
	"hash tag":         "{a}b",
	"newline":          "a\nb",
	"CRLF and command": "a\r\nSET x 1",
	"NUL":              "a\x00b",
	"DEL":              "a\x7fb",
	"C1 control":       "a\u0085b",
	"invalid UTF-8":    "a\xffb",
	"129 bytes":        strings.Repeat("x", 129),
	"1 MiB":            strings.Repeat("x", 1<<20),
	"empty":            "",
}

// globValues mean something to KEYS and SCAN, nothing in a key: they are
// accepted and taken literally.
var globValues = []string{"*", "?", "[a-z]", "sku*", `\*`}

// hostileCase is one request and the answer it must get.
type hostileCase struct {
	name   string
	req    func() *http.Request
	status int
	code   string // the "error" member; empty: any
	router bool   // answered by gin's router (no route matches), not by the middleware
}

// hc is a hostileCase answered by the middleware.
func hc(name string, req func() *http.Request, status int, code string) hostileCase {
	return hostileCase{name: name, req: req, status: status, code: code}
}

func hostileCases() []hostileCase {
	var cs []hostileCase
	for name, v := range unsafeValues {
		code := "unsafe_value"
		if v == "" {
			code = "missing_field"
		}
		bodyStatus, bodyCode := 400, code
		if len(v) >= 1<<20 {
			bodyStatus, bodyCode = 413, "body_too_large" // over the default 1 MiB body limit
		}
		pathStatus, pathByRouter := 400, false
		if v == "" {
			pathStatus, pathByRouter = 404, true // "/lock/" matches no route
		}
		cs = append(cs,
			hostileCase{name: "path " + name, req: func() *http.Request { return post("/lock/"+url.PathEscape(v), "", "") },
				status: pathStatus, code: code, router: pathByRouter},
			hc("query "+name, func() *http.Request { return post("/query?sku="+url.QueryEscape(v), "", "") }, 400, code),
			hc("header "+name, func() *http.Request {
				req := post("/header", "", "")
				req.Header["X-User"] = []string{v}
				return req
			}, 400, code),
			hc("body "+name, func() *http.Request {
				return post("/body", "application/json", `{"order":{"sku":`+jsonText(v)+`}}`)
			}, bodyStatus, bodyCode),
			hc("JSON body under a 4 MiB limit "+name, func() *http.Request {
				return post("/big", "application/json", `{"sku":`+jsonText(v)+`}`)
			}, 400, code),
			hc("form body "+name, func() *http.Request {
				return post("/big", "application/x-www-form-urlencoded", "sku="+url.QueryEscape(v))
			}, 400, code),
			hostileCase{name: "policy path " + name, req: func() *http.Request {
				req := post("/pol/"+url.PathEscape(v), "application/json", `{"nonce":"n1"}`)
				req.Header.Set("X-User", "u1")
				return req
			}, status: pathStatus, code: code, router: pathByRouter},
			hc("policy body "+name, func() *http.Request {
				req := post("/pol/s1", "application/json", `{"nonce":`+jsonText(v)+`}`)
				req.Header.Set("X-User", "u1")
				return req
			}, bodyStatus, bodyCode),
			hc("idempotency scope "+name, func() *http.Request {
				req := post("/pay", "application/json", `{}`)
				req.Header["X-User"] = []string{v}
				req.Header.Set("Idempotency-Key", "k1")
				return req
			}, 400, code),
		)
	}
	for name, key := range map[string]string{
		"newline": "a\nb", "NUL": "a\x00b", "non-ASCII": "é", "256 bytes": strings.Repeat("k", 256),
		"1 MiB": strings.Repeat("k", 1<<20), "parameters": `"a";p=1`, "list": `"a", "b"`, "unterminated": `"abc`,
		"space": "a b", "empty": `""`,
	} {
		cs = append(cs, hc("idempotency key "+name, func() *http.Request {
			req := post("/pay", "application/json", `{}`)
			req.Header.Set("X-User", "u1")
			req.Header["Idempotency-Key"] = []string{key}
			return req
		}, 400, "idempotency_key_invalid"))
	}
	cs = append(cs,
		hc("idempotency key sent twice", func() *http.Request {
			req := post("/pay", "application/json", `{}`)
			req.Header.Set("X-User", "u1")
			req.Header["Idempotency-Key"] = []string{"a", "b"}
			return req
		}, 400, "idempotency_key_invalid"),
		hc("idempotency key missing", func() *http.Request {
			req := post("/pay", "application/json", `{}`)
			req.Header.Set("X-User", "u1")
			return req
		}, 400, "idempotency_key_missing"),
	)
	big := `{"order":{"sku":"s1"},"pad":"` + strings.Repeat("x", 2<<20) + `"}`
	for name, body := range map[string]string{
		"truncated JSON":   `{"order":{"sku":"s1"`,
		"not JSON":         `order.sku=s1`,
		"JSON array":       `[{"order":{"sku":"s1"}}]`,
		"JSON string":      `"s1"`,
		"member twice":     `{"order":{"sku":"a","SKU":"b"}}`,
		"object as value":  `{"order":{"sku":{"$ne":null}}}`,
		"array as value":   `{"order":{"sku":["a","b"]}}`,
		"trailing garbage": `{"order":{"sku":"s1"}} {}`,
		"NUL byte in JSON": "{\"order\":{\"sku\":\"s1\"}}\x00",
	} {
		cs = append(cs, hc("body "+name, func() *http.Request { return post("/body", "application/json", body) }, 400, ""))
	}
	cs = append(cs,
		hc("body empty", func() *http.Request { return post("/body", "application/json", "") }, 400, "missing_field"),
		hc("body 2 MiB", func() *http.Request { return post("/body", "application/json", big) }, 413, "body_too_large"),
		hc("body 2 MiB without length", func() *http.Request {
			req := post("/body", "application/json", "")
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(big)), -1
			return req
		}, 413, "body_too_large"),
		hc("multipart without boundary", func() *http.Request {
			return post("/big", "multipart/form-data", "--x\r\n")
		}, 400, "bad_body"),
		hc("multipart malformed", func() *http.Request {
			return post("/big", "multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=\"sku\"\r\n\r\ns1")
		}, 400, "bad_body"),
	)
	return cs
}

// Hostile keys, values and bodies through the Gin middleware and the policy
// loader: each gets a clear 4xx, the handler never runs, no Redis key is
// created, and the answer never echoes the value back.
func TestHostile_EveryBadRequestIsA4xxAndCreatesNoKey(t *testing.T) {
	s := newHostileService(t)
	for _, tc := range hostileCases() {
		s.reset(t)
		runs := s.runs.Load()
		w := s.serve(tc.req())
		if tc.router {
			if w.Code != tc.status || s.runs.Load() != runs || len(s.keys(t)) != 0 {
				t.Errorf("%s: %d, want %d from the router and nothing else", tc.name, w.Code, tc.status)
			}
			continue
		}
		var answer struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &answer); err != nil || answer.Error == "" {
			t.Errorf("%s: %d %q is not a JSON error answer", tc.name, w.Code, w.Body.String())
			continue
		}
		if w.Code != tc.status || (tc.code != "" && answer.Error != tc.code) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, w.Code, w.Body.String(), tc.status, tc.code)
		}
		if w.Body.Len() > 512 {
			t.Errorf("%s: a %d-byte answer (the value echoed?)", tc.name, w.Body.Len())
		}
		if s.runs.Load() != runs {
			t.Errorf("%s: the handler ran", tc.name)
		}
		if keys := s.keys(t); len(keys) != 0 {
			t.Errorf("%s: left Redis keys %q", tc.name, keys)
		}
	}
}

// safeKey matches every key a successful request may leave: the token
// counter of its lock (which has no expiry, by design) and its idempotency
// record, whose name is a hash of the route, the caller and the key.
var safeKey = regexp.MustCompile(`^(redisson_lock_token:\{(sku|user|order):[^{}]+\}|(redisson_lock_token:)?seckillguard:idem:\{[0-9a-f]{32}\}(:r)?)$`)

// Characters that mean something to KEYS, SCAN and Redis patterns are
// accepted and taken literally: "sku:*" is one lock, which excludes neither
// "sku:1" nor anything else, and the request leaves only its token counter.
func TestHostile_GlobCharactersAreLiteral(t *testing.T) {
	s := newHostileService(t)
	for _, v := range globValues {
		s.reset(t)
		// Hold sku:1 the way another request would: the glob must not be
		// blocked by it.
		other := lock.New(s.srv.Client(), lock.WithLogger(quiet))
		held, err := other.Mutex("sku:1").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		w := s.serve(post("/lock/"+url.PathEscape(v), "", ""))
		if w.Code != http.StatusOK {
			t.Errorf("%q: %d %s, want 200 (a literal key, not blocked by sku:1)", v, w.Code, w.Body.String())
		}
		if err := other.Mutex("sku:1").Unlock(held); err != nil {
			t.Fatal(err)
		}
		other.Close()
		for _, k := range s.keys(t) {
			if k != "redisson_lock_token:{sku:"+v+"}" && k != "redisson_lock_token:{sku:1}" {
				t.Errorf("%q: left key %q", v, k)
			}
		}
		// And the other way round: a request holding sku:* does not block sku:1.
		w = s.serve(post("/lock/1", "", ""))
		if w.Code != http.StatusOK {
			t.Errorf("sku:1 after %q: %d", v, w.Code)
		}
	}
	// A lone surrogate escape reads as U+FFFD, as encoding/json (and so the
	// handler's own binding) reads it: a valid, safe value.
	s.reset(t)
	if w := s.serve(post("/body", "application/json", `{"order":{"sku":"\ud800"}}`)); w.Code != http.StatusOK {
		t.Errorf("lone surrogate: %d %s", w.Code, w.Body.String())
	}
	if keys := s.keys(t); len(keys) != 1 || keys[0] != "redisson_lock_token:{order:\ufffd}" {
		t.Errorf("lone surrogate left %q", keys)
	}
	// Accepted idempotency keys that look like patterns or hash tags only
	// ever appear hashed.
	for _, key := range []string{"*", `"{a}b"`, `"a b"`, "k/../x", `"\\"`} {
		s.reset(t)
		req := post("/pay", "application/json", `{}`)
		req.Header.Set("X-User", "u1")
		req.Header["Idempotency-Key"] = []string{key}
		if w := s.serve(req); w.Code != http.StatusOK {
			t.Errorf("idempotency key %q: %d %s", key, w.Code, w.Body.String())
		}
		for _, k := range s.keys(t) {
			if !safeKey.MatchString(k) {
				t.Errorf("idempotency key %q left key %q", key, k)
			}
		}
	}
}

// On the wire, net/http refuses what the middleware never sees; those
// answers are 4xx too and create nothing.
func TestHostile_WireLevelAbusesAre4xx(t *testing.T) {
	s := newHostileService(t)
	hs := httptest.NewServer(s.r)
	defer hs.Close()
	raw := func(request string, halfClose bool) int {
		t.Helper()
		c, err := net.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		if halfClose {
			_ = c.(*net.TCPConn).CloseWrite()
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	cases := map[string]struct {
		req       string
		halfClose bool
	}{
		"header with NUL":          {"POST /header HTTP/1.1\r\nHost: x\r\nX-User: a\x00b\r\nContent-Length: 0\r\n\r\n", false},
		"header with bare CR":      {"POST /header HTTP/1.1\r\nHost: x\r\nX-User: a\rb\r\nContent-Length: 0\r\n\r\n", false},
		"1 MiB header":             {"POST /header HTTP/1.1\r\nHost: x\r\nX-User: " + strings.Repeat("x", 1<<20) + "\r\nContent-Length: 0\r\n\r\n", false},
		"body shorter than length": {"POST /body HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"order\":", true},
		"path with raw NUL":        {"POST /lock/a\x00b HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", false},
	}
	for name, tc := range cases {
		s.reset(t)
		if status := raw(tc.req, tc.halfClose); status < 400 || status > 499 {
			t.Errorf("%s: %d, want a 4xx", name, status)
		}
		if keys := s.keys(t); len(keys) != 0 {
			t.Errorf("%s: left Redis keys %q", name, keys)
		}
	}
	if s.runs.Load() != 0 {
		t.Errorf("the handler ran %d times", s.runs.Load())
	}
}

package guard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// carriesNamespace reports whether the Redis key k belongs to namespace ns:
// the name "ns:..." itself, or a key Redisson's rule derived from such a
// name ("redisson_lock_token:{ns:...}", "prefix:ns:...{id}").
func carriesNamespace(k, ns string) bool {
	return strings.HasPrefix(k, ns+":") || strings.Contains(k, "{"+ns+":") || strings.Contains(k, ":"+ns+":")
}

// scanAll returns every key of the server.
func scanAll(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	var keys []string
	iter := rdb.Scan(context.Background(), 0, "*", 100).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// Two services on one Redis, one with guard.WithNamespace and one with
// lock.WithNamespace in WithLockOptions (the way it was set before
// WithNamespace): with the same route, caller and key they never replay
// each other's answers, never wait for each other's locks, and every key
// each one writes (locks and their token counters, idempotency records and
// in-progress markers, WaitForFirst's semaphores) carries its namespace.
// The idempotency records used to ignore the namespace, so that the second
// service was replayed the first one's payment.
func TestNamespace_TwoGuardsOnOneRedisNeverShareKeys(t *testing.T) {
	srv := testenv.Redis(t)
	type service struct {
		ns    string
		in    *instance
		logs  *bytes.Buffer
		runs  int
		mu    sync.Mutex
		hold  chan struct{}
		holds chan struct{}
	}
	newService := func(ns string, opt guard.Option) *service {
		s := &service{ns: ns, logs: new(bytes.Buffer), hold: make(chan struct{}), holds: make(chan struct{}, 4)}
		log := slog.New(slog.NewJSONHandler(&lockedWriter{w: s.logs}, nil))
		s.in = newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
			r.Use(withUser)
			h := func(c *gin.Context) {
				s.mu.Lock()
				s.runs++
				s.mu.Unlock()
				if c.Query("hold") != "" {
					s.holds <- struct{}{}
					<-s.hold
					time.Sleep(2 * time.Millisecond) // a hold over the route's LongHold, to be logged
				}
				c.JSON(http.StatusCreated, gin.H{"service": ns, "key": guard.Key(c), "redis_key": guard.RedisKey(c)})
			}
			r.POST("/pay/:sku", g.Idempotent(guard.Scope("<ctx:user_id>")), g.Lock("sku:<sku>", guard.Wait(100*time.Millisecond), guard.LongHold(time.Millisecond)), h)
			r.POST("/wait/:sku", g.Idempotent(guard.Scope("<ctx:user_id>"), guard.WaitForFirst(time.Second)), g.Lock("sku:<sku>", guard.Wait(100*time.Millisecond)), h)
		}, opt, guard.WithLogger(log))
		return s
	}
	a := newService("svc-a", guard.WithNamespace("svc-a"))
	b := newService("svc-b", guard.WithLockOptions(lock.WithNamespace("svc-b")))
	if a.in.g.Namespace() != "svc-a" || b.in.g.Namespace() != "svc-b" {
		t.Fatalf("namespaces %q and %q", a.in.g.Namespace(), b.in.g.Namespace())
	}

	// Both hold the same lock name and the same idempotency keys at once.
	var wg sync.WaitGroup
	answers := map[string]reply{}
	var mu sync.Mutex
	for _, s := range []*service{a, b} {
		for _, path := range []string{"/pay/42?hold=1", "/wait/7?hold=1"} {
			wg.Go(func() {
				r := do(t, "POST", s.in.srv.URL+path, "", "Idempotency-Key", "k-1", "X-User-ID", "u1")
				mu.Lock()
				answers[s.ns+path] = r
				mu.Unlock()
			})
		}
	}
	holding := 0
	for timeout := time.After(5 * time.Second); holding < 4; {
		select {
		case <-a.holds:
		case <-b.holds:
		case <-timeout:
			mu.Lock()
			t.Errorf("%d of the 4 requests hold their names; the others did not run: %v", holding, answers)
			mu.Unlock()
			holding = 4
			continue
		}
		holding++
	}
	keys := scanAll(t, a.in.rdb)
	close(a.hold)
	close(b.hold)
	wg.Wait()
	for k, r := range answers {
		ns := k[:5]
		if r.status != http.StatusCreated || r.header.Get(guard.ReplayedHeader) != "" || !strings.Contains(string(r.body), `"service":"`+ns+`"`) {
			t.Errorf("%s: %d %s (replayed %q); want its own service's 201, run while the other held the same names",
				k, r.status, r.body, r.header.Get(guard.ReplayedHeader))
		}
	}
	if r := answers["svc-a/pay/42?hold=1"]; !strings.Contains(string(r.body), `"key":"sku:42","redis_key":"svc-a:sku:42"`) {
		t.Errorf("Key and RedisKey: %s; want the name and the full key", r.body)
	}
	// And after: the records and token counters.
	keys = append(keys, scanAll(t, a.in.rdb)...)
	seen := map[string]int{}
	for _, k := range keys {
		switch {
		case carriesNamespace(k, "svc-a"):
			seen["svc-a"]++
		case carriesNamespace(k, "svc-b"):
			seen["svc-b"]++
		default:
			t.Errorf("key %q carries neither namespace", k)
		}
	}
	if seen["svc-a"] < 4 || seen["svc-b"] < 4 {
		t.Errorf("keys per namespace %v of %v; want each service's locks, markers, semaphores and records", seen, keys)
	}

	// A retry replays each service's own answer.
	for _, s := range []*service{a, b} {
		r := do(t, "POST", s.in.srv.URL+"/pay/42?hold=1", "", "Idempotency-Key", "k-1", "X-User-ID", "u1")
		if r.header.Get(guard.ReplayedHeader) != "true" || !strings.Contains(string(r.body), `"service":"`+s.ns+`"`) {
			t.Errorf("%s retry: %d %s (replayed %q); want its own answer replayed", s.ns, r.status, r.body, r.header.Get(guard.ReplayedHeader))
		}
		s.mu.Lock()
		if s.runs != 2 {
			t.Errorf("%s ran its handler %d times, want 2 (one per route)", s.ns, s.runs)
		}
		s.mu.Unlock()
	}

	// The log line of a long hold names the full key.
	var line struct{ Key string }
	for _, l := range strings.Split(a.logs.String(), "\n") {
		if strings.Contains(l, "held longer") {
			_ = json.Unmarshal([]byte(l), &line)
		}
	}
	if line.Key != "svc-a:sku:42" {
		t.Errorf("the long-hold log line names key %q, want the full key svc-a:sku:42:\n%s", line.Key, a.logs.String())
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The namespace is set once: WithNamespace and a lock.WithNamespace that
// differs are refused at New, as is a namespace with a brace; the same one
// given both ways is one namespace.
func TestNamespace_IsSetOnce(t *testing.T) {
	rdb := testenv.Redis(t).Client()
	for name, opts := range map[string][]guard.Option{
		"two namespaces": {guard.WithNamespace("a"), guard.WithLockOptions(lock.WithNamespace("b"))},
		"a brace":        {guard.WithNamespace("a{b}")},
		// The lock Client refuses these itself; New must say so, not
		// every request with a 500.
		"a brace given to the lock Client":              {guard.WithLockOptions(lock.WithNamespace("a{b}"))},
		"a brace given to the lock Client, and another": {guard.WithNamespace("a"), guard.WithLockOptions(lock.WithNamespace("a}"))},
		"a watchdog timeout the lock Client refuses":    {guard.WithLockOptions(lock.WithWatchdogTimeout(time.Millisecond))},
	} {
		v := registrationPanic(func() { guard.New(rdb, opts...).Close() })
		err, _ := v.(error)
		switch {
		case v == nil:
			t.Errorf("%s: New accepted it", name)
		case strings.Contains(name, "lock Client") && !errors.Is(err, lock.ErrInvalid):
			t.Errorf("%s: New panicked with %v; want the lock Client's error (lock.ErrInvalid)", name, v)
		}
	}
	g := guard.New(rdb, guard.WithNamespace("a"), guard.WithLockOptions(lock.WithNamespace("a")))
	defer g.Close()
	if g.Namespace() != "a" || g.Locks().Key("sku:1") != "a:sku:1" {
		t.Errorf("Namespace %q, lock key %q; want one namespace, applied once", g.Namespace(), g.Locks().Key("sku:1"))
	}
}

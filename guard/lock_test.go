package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// stock is shared state the handlers update with read-modify-write, as the
// usual flash-sale handler does; only the lock keeps it consistent.
type stock struct {
	mu       sync.Mutex // guards the map itself, not the read-modify-write
	counts   map[string]int
	inside   map[string]*atomic.Int32
	overlaps atomic.Int32
	busiest  atomic.Int32 // most critical sections (of any SKU) running at once
	running  atomic.Int32
}

func newStock() *stock {
	return &stock{counts: map[string]int{}, inside: map[string]*atomic.Int32{}}
}

func (s *stock) get(sku string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[sku]
}

func (s *stock) set(sku string, v int) {
	s.mu.Lock()
	s.counts[sku] = v
	s.mu.Unlock()
}

func (s *stock) enter(sku string) func() {
	s.mu.Lock()
	in := s.inside[sku]
	if in == nil {
		in = new(atomic.Int32)
		s.inside[sku] = in
	}
	s.mu.Unlock()
	if in.Add(1) != 1 {
		s.overlaps.Add(1)
	}
	n := s.running.Add(1)
	for {
		b := s.busiest.Load()
		if n <= b || s.busiest.CompareAndSwap(b, n) {
			break
		}
	}
	return func() { s.running.Add(-1); in.Add(-1) }
}

// buy is the handler: read, wait a little (a slow database), write.
func (s *stock) buy(c *gin.Context) {
	sku := c.Param("sku")
	defer s.enter(sku)()
	v := s.get(sku)
	time.Sleep(2 * time.Millisecond)
	s.set(sku, v+1)
	c.JSON(http.StatusOK, gin.H{"sku": sku})
}

func TestLock_ThreeInstancesLoseNoUpdate(t *testing.T) {
	srv := testenv.Redis(t)
	st := newStock()
	var inst []*instance
	for i := 0; i < 3; i++ {
		inst = append(inst, newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
			r.POST("/api/seckill/:sku", g.Lock("sku:<sku>", guard.Wait(60*time.Second)), st.buy)
		}))
	}
	const requests = 500
	skus := []string{"sku-1", "sku-2"}
	var ok atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < requests; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sku := skus[0]
			if i%5 == 0 {
				sku = skus[1]
			}
			r := do(t, "POST", inst[i%3].srv.URL+"/api/seckill/"+sku, "")
			if r.status == http.StatusOK {
				ok.Add(1)
			} else {
				t.Errorf("request %d: %d %s", i, r.status, r.body)
			}
		}()
	}
	wg.Wait()
	if got := st.get(skus[0]) + st.get(skus[1]); got != int(ok.Load()) || got != requests {
		t.Fatalf("counters sum to %d after %d successful requests of %d: updates were lost", got, ok.Load(), requests)
	}
	if n := st.overlaps.Load(); n != 0 {
		t.Fatalf("%d critical sections of one SKU overlapped", n)
	}
	if st.busiest.Load() < 2 {
		t.Fatal("two SKUs never ran at the same time: the lock must be per SKU, not global")
	}
}

// route builds a one-route instance.
func route(t testing.TB, srv *testenv.RedisServer, method, path string, h ...gin.HandlerFunc) *instance {
	return newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) { r.Handle(method, path, h...) })
}

func TestLock_AnswersEveryCaseOfTheTable(t *testing.T) {
	srv := testenv.Redis(t)
	hold := make(chan struct{})
	var in *instance
	in = newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		ok := func(c *gin.Context) { c.JSON(200, gin.H{"key": guard.Key(c)}) }
		r.POST("/a/:sku", g.Lock("sku:<sku>:<body:user>"), ok)
		r.POST("/small/:sku", g.Lock("sku:<sku>:<body:user>", guard.BodyLimit(16)), ok)
		r.POST("/slow/:sku", g.Lock("slow:<sku>"), func(c *gin.Context) { <-hold; c.Status(200) })
		r.POST("/busy/:sku", g.Lock("slow:<sku>", guard.Wait(100*time.Millisecond), guard.RetryAfter(3*time.Second)), ok)
		r.POST("/stale/:sku", g.Lock("stale:<sku>"), func(c *gin.Context) {
			_ = c.Error(fmt.Errorf("update products: %w", fencing.Stale("products", "sku=1", 5, 9)))
		})
	})
	url := in.srv.URL

	r := do(t, "POST", url+"/a/1", `{"other":1}`)
	if r.status != 400 || r.errorCode() != "missing_field" || !strings.Contains(string(r.body), `"field":"user"`) {
		t.Errorf("missing field: %d %s", r.status, r.body)
	}
	for _, bad := range []string{`{"user":"a{b"}`, `{"user":"a\nb"}`, `{"user":"a\u0000b"}`, `{"user":"` + strings.Repeat("x", 129) + `"}`} {
		if r := do(t, "POST", url+"/a/1", bad); r.status != 400 || r.errorCode() != "unsafe_value" {
			t.Errorf("unsafe value %.40q: %d %s", bad, r.status, r.body)
		}
	}
	if r := do(t, "POST", url+"/small/1", `{"user":"abcdefghijklmnop"}`); r.status != 413 || r.errorCode() != "body_too_large" {
		t.Errorf("body over the limit: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", url+"/a/1", `{"user":"u1"}`); r.status != 200 || !strings.Contains(string(r.body), "sku:1:u1") {
		t.Errorf("good request: %d %s", r.status, r.body)
	}

	done := make(chan reply)
	go func() { done <- do(t, "POST", url+"/slow/7", "") }()
	eventually(t, func() bool { n, _ := in.rdb.Exists(context.Background(), "slow:7").Result(); return n == 1 })
	r = do(t, "POST", url+"/busy/7", `{}`)
	if r.status != 429 || r.errorCode() != "busy" || r.header.Get("Retry-After") != "3" {
		t.Errorf("busy: %d %s Retry-After=%q", r.status, r.body, r.header.Get("Retry-After"))
	}
	close(hold)
	<-done

	if r := do(t, "POST", url+"/stale/1", ""); r.status != 409 || r.errorCode() != "stale_write" {
		t.Errorf("stale write: %d %s", r.status, r.body)
	}
	// Only the token counters of the three locks taken remain: no key was
	// ever made from a refused request.
	keys, _ := in.rdb.Keys(context.Background(), "*").Result()
	sort.Strings(keys)
	want := []string{"redisson_lock_token:{sku:1:u1}", "redisson_lock_token:{slow:7}", "redisson_lock_token:{stale:1}"}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("keys left: %v, want %v", keys, want)
	}
}

func TestLock_RedisDownFailsClosedUnlessTheRouteFailsOpen(t *testing.T) {
	srv := testenv.Redis(t)
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		ok := func(c *gin.Context) { c.Status(204) }
		r.POST("/closed/:id", g.Lock("c:<id>"), ok)
		r.POST("/open/:id", g.Lock("o:<id>", guard.FailOpen()), ok)
	})
	in.rdb.Options().MaxRetries = -1
	srv.Kill()
	if r := do(t, "POST", in.srv.URL+"/closed/1", ""); r.status != 503 || r.errorCode() != "lock_unavailable" {
		t.Errorf("Redis down, fail closed: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", in.srv.URL+"/open/1", ""); r.status != 204 {
		t.Errorf("Redis down, fail open: %d %s", r.status, r.body)
	}
}

func TestLock_PanickingHandlerReleasesTheLock(t *testing.T) {
	srv := testenv.Redis(t)
	in := route(t, srv, "POST", "/p/:id", guard.New(srv.Client(), guard.WithLogger(quiet)).Lock("p:<id>"), func(c *gin.Context) {
		panic("handler bug")
	})
	if r := do(t, "POST", in.srv.URL+"/p/1", ""); r.status != 500 {
		t.Fatalf("panic: %d", r.status)
	}
	if n, _ := in.rdb.Exists(context.Background(), "p:1").Result(); n != 0 {
		t.Fatal("the lock outlived the panicking handler")
	}
}

func TestLock_HandlerReentersThroughTheRequestContext(t *testing.T) {
	srv := testenv.Redis(t)
	var g *guard.Guard
	in := newInstance(t, srv, func(gg *guard.Guard, r *gin.Engine) {
		g = gg
		r.POST("/r/:id", g.Lock("r:<id>", guard.Wait(0)), func(c *gin.Context) {
			// Code deeper in the handler locks the same key again.
			m := g.Locks().Mutex(guard.Key(c))
			ctx, err := m.TryLock(c.Request.Context(), 0)
			if err != nil {
				c.String(500, err.Error())
				return
			}
			n, _ := m.HoldCount(ctx)
			tok, _ := guard.Token(c)
			inner, _ := fencing.FromContext(ctx)
			m.Unlock(ctx)
			c.JSON(200, gin.H{"levels": n, "same_token": tok == inner && tok.Valid()})
		})
	})
	r := do(t, "POST", in.srv.URL+"/r/9", "")
	if r.status != 200 || string(r.body) != `{"levels":2,"same_token":true}` {
		t.Fatalf("re-entry: %d %s", r.status, r.body)
	}
}

func TestLock_LostLockCancelsTheHandlerAndAnswers409(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	g := guard.New(srv.Client(), guard.WithLogger(quiet), guard.WithLockOptions(lock.WithWatchdogTimeout(300*time.Millisecond)))
	defer g.Close()
	r := gin.New()
	var cause atomic.Value
	r.POST("/l/:id", g.Lock("l:<id>"), func(c *gin.Context) {
		ctx := c.Request.Context()
		<-ctx.Done() // the work: the lock is deleted from outside meanwhile
		cause.Store(context.Cause(ctx))
	})
	done := make(chan reply)
	go func() { done <- serve(r, "POST", "/l/1") }()
	eventually(t, func() bool { n, _ := rdb.Exists(context.Background(), "l:1").Result(); return n == 1 })
	rdb.Del(context.Background(), "l:1")
	select {
	case rep := <-done:
		if rep.status != 409 || rep.errorCode() != "lock_lost" {
			t.Fatalf("lost lock: %d %s", rep.status, rep.body)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the handler's context was not cancelled when its lock vanished")
	}
	if c, _ := cause.Load().(error); !errors.Is(c, lock.ErrLost) {
		t.Fatalf("handler saw cause %v, want lock.ErrLost", c)
	}
}

func TestLock_DefaultGuard(t *testing.T) {
	old := guard.Default()
	defer guard.SetDefault(old)
	guard.SetDefault(nil)
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "SetDefault") {
				t.Fatalf("guard.Lock without a default Guard: panic %v, want one naming SetDefault", r)
			}
		}()
		guard.Lock("sku:<id>")
	}()
	srv := testenv.Redis(t)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	guard.SetDefault(g)
	r := gin.New()
	r.Use(guard.Lock("sku:<id>"))
	r.POST("/buy/:id", func(c *gin.Context) { c.String(200, guard.Key(c)) })
	if rep := serve(r, "POST", "/buy/42"); rep.status != 200 || string(rep.body) != "sku:42" {
		t.Fatalf("r.Use(guard.Lock(\"sku:<id>\")): %d %s", rep.status, rep.body)
	}
}

func TestLock_BadConfigurationPanicsAtRegistration(t *testing.T) {
	srv := testenv.Redis(t)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	for name, f := range map[string]func(){
		"template":      func() { g.Lock("sku:<id") },
		"negative wait": func() { g.Lock("x", guard.Wait(-time.Second)) },
		"zero lease":    func() { g.Lock("x", guard.Lease(0)) },
		"busy 200":      func() { g.Lock("x", guard.Busy(200, "busy")) },
		"nil redis":     func() { guard.New(nil) },
		"no scope":      func() { g.Idempotent() },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil {
					t.Fatal("no panic")
				} else if !strings.Contains(fmt.Sprint(r), "guard") && !strings.Contains(fmt.Sprint(r), "ginmw") {
					t.Fatalf("panic %v does not say where it comes from", r)
				}
			}()
			f()
		})
	}
}

// serve runs one request through r in-process.
func serve(r *gin.Engine, method, path string, headers ...string) reply {
	req, _ := http.NewRequest(method, path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	w := newRecorder()
	r.ServeHTTP(w, req)
	return reply{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

func eventually(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

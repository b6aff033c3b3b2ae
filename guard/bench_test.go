package guard_test

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// BenchmarkLockMiddleware measures what guard.Lock itself costs a request,
// uncontended, Redis round trips excluded: a request through guard.Lock
// against the same request through a bare middleware that takes and
// releases the same kind of lock (lock.Mutex TryLock and Unlock, on the
// Guard's own lock Client) and does nothing else. Both make the same round
// trips to Redis, so the difference is the middleware: the key template,
// the context swap, the metrics, the checks after the handler. A third
// route, "floor", makes only the two round trips any lock needs (one
// EVALSHA to take, one to release), for scale.
//
// The routes take turns in short blocks (blockSize requests, in an order
// rotated each block) so that noise from elsewhere on the machine hits all
// of them alike; each block's wall time and process CPU time (getrusage:
// the Go side only, redis-server is another process) are divided by its
// requests, and each reported number is the median over the blocks. The
// middleware's cost is the median of the per-block differences guarded −
// mutex, once in wall time (middleware-µs) and once in CPU time
// (middleware-cpu-µs), the latter insensitive to time spent waiting for
// Redis or for a core. ns/op is the guarded route's median; allocations are
// counted per block too (runtime.MemStats, outside the timed part). For a
// steady number:
//
//	go test -run '^$' -bench LockMiddleware -benchtime 20000x -count 5 ./guard/
func BenchmarkLockMiddleware(b *testing.B) {
	srv := testenv.Redis(b)
	rdb := srv.Client()
	g := guard.New(rdb, guard.WithLogger(quiet))
	defer g.Close()
	ok := func(c *gin.Context) { c.Status(http.StatusNoContent) }

	guarded := gin.New()
	guarded.POST("/api/seckill/:sku", g.Lock("sku:<sku>"), ok)

	take := redis.NewScript(`if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', 30000) then return 1 end return 0`)
	release := redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
	floor := gin.New()
	floor.POST("/api/seckill/:sku", func(c *gin.Context) {
		key := "floor:" + c.Param("sku")
		take.Run(c, rdb, []string{key}, "v")
		c.Next()
		release.Run(c, rdb, []string{key}, "v")
	}, ok)

	locks := g.Locks()
	bare := gin.New()
	bare.POST("/api/seckill/:sku", func(c *gin.Context) {
		m := locks.Mutex("bare:" + c.Param("sku"))
		ctx, err := m.TryLock(c.Request.Context(), 2*time.Second)
		if err != nil {
			c.AbortWithStatus(500)
			return
		}
		c.Next()
		m.Unlock(ctx)
	}, ok)

	routes := []*gin.Engine{guarded, bare, floor}
	const blockSize = 50
	type sample struct{ wall, cpu, allocs float64 } // per request in one block: µs, µs, count
	samples := make([][]sample, len(routes))
	// run serves n requests on r and returns the wall and CPU time per request.
	run := func(r *gin.Engine, n int) sample {
		req := httptest.NewRequest("POST", "/api/seckill/sku-1", nil)
		w := httptest.NewRecorder()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		mallocs := ms.Mallocs
		cpu0, t0 := processCPU(b), time.Now()
		for range n {
			r.ServeHTTP(w, req)
		}
		wall, cpu := time.Since(t0), processCPU(b)-cpu0
		runtime.ReadMemStats(&ms)
		if w.Code != http.StatusNoContent {
			b.Fatalf("answered %d", w.Code)
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
		return sample{per(wall), per(cpu), float64(ms.Mallocs-mallocs) / float64(n)}
	}
	for _, r := range routes {
		run(r, 200) // load the scripts, open the connections
	}
	b.ResetTimer()
	block := 0
	for done := 0; done < b.N; block++ {
		n := min(blockSize, b.N-done)
		for i := range routes {
			j := (block + i) % len(routes)
			samples[j] = append(samples[j], run(routes[j], n))
		}
		done += n
	}
	b.StopTimer()
	median := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		if len(s)%2 == 0 {
			return (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		return s[len(s)/2]
	}
	of := func(route int, f func(sample) float64) []float64 {
		var out []float64
		for _, s := range samples[route] {
			out = append(out, f(s))
		}
		return out
	}
	diff := func(f func(sample) float64) []float64 {
		var out []float64
		for k := range samples[0] {
			out = append(out, f(samples[0][k])-f(samples[1][k]))
		}
		return out
	}
	wall := func(s sample) float64 { return s.wall }
	cpu := func(s sample) float64 { return s.cpu }
	allocs := func(s sample) float64 { return s.allocs }
	b.ReportMetric(median(of(0, wall))*1e3, "ns/op")
	b.ReportMetric(median(of(0, wall)), "guarded-µs/op")
	b.ReportMetric(median(of(1, wall)), "mutex-µs/op")
	b.ReportMetric(median(of(2, wall)), "floor-µs/op")
	b.ReportMetric(median(of(0, cpu)), "guarded-cpu-µs/op")
	b.ReportMetric(median(of(1, cpu)), "mutex-cpu-µs/op")
	b.ReportMetric(median(diff(wall)), "middleware-µs")
	b.ReportMetric(median(diff(cpu)), "middleware-cpu-µs")
	b.ReportMetric(median(of(0, allocs)), "guarded-allocs/op")
	b.ReportMetric(median(diff(allocs)), "middleware-allocs")
}

// processCPU returns the CPU time (user + system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdempotentReplay measures a replayed request: one GET, no handler.
func BenchmarkIdempotentReplay(b *testing.B) {
	srv := testenv.Redis(b)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	r := gin.New()
	r.Use(withUser)
	r.POST("/pay", g.Idempotent(guard.Scope("<ctx:user_id>")), func(c *gin.Context) { c.JSON(201, gin.H{"ok": true}) })
	req := httptest.NewRequest("POST", "/pay", nil)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-User-ID", "u1")
	r.ServeHTTP(httptest.NewRecorder(), req) // the first, stored
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Header().Get(guard.ReplayedHeader) != "true" {
			b.Fatalf("not replayed: %d", w.Code)
		}
	}
}

package guard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testenv"
)

// BenchmarkLockMiddleware measures a request through guard.Lock, uncontended,
// and beside it the same request through a middleware that only makes the
// two round trips any lock needs (one EVALSHA to take, one to release). The
// difference, reported as overhead-µs, is what the middleware itself costs.
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

	run := func(r *gin.Engine, n int) time.Duration {
		req := httptest.NewRequest("POST", "/api/seckill/sku-1", nil)
		w := httptest.NewRecorder()
		start := time.Now()
		for i := 0; i < n; i++ {
			r.ServeHTTP(w, req)
		}
		return time.Since(start)
	}
	run(guarded, 100) // load scripts, warm pools
	run(floor, 100)
	run(bare, 100)
	_ = context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	// Interleave in slices so that machine noise hits both alike.
	var full, base, mutex time.Duration
	for done := 0; done < b.N; {
		n := min(200, b.N-done)
		full += run(guarded, n)
		base += run(floor, n)
		mutex += run(bare, n)
		done += n
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / 1000 }
	b.ReportMetric(per(full), "guarded-µs/op")
	b.ReportMetric(per(base), "floor-µs/op")
	b.ReportMetric(per(mutex), "mutex-µs/op")
	b.ReportMetric(per(full)-per(mutex), "middleware-µs")
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
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Header().Get(guard.ReplayedHeader) != "true" {
			b.Fatalf("not replayed: %d", w.Code)
		}
	}
}

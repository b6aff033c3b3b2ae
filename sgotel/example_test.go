package sgotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
	"github.com/seckillguard/seckillguard/sgotel"
)

// A traced Guard: each guarded request's steps, and the wait and the hold of
// its lock, become spans of the request's trace (children of the server
// span an HTTP instrumentation such as otelgin starts; here there is none,
// so they are roots).
func ExampleGuardOptions() {
	// In a service: the TracerProvider with its exporter, set once at
	// start (otel.SetTracerProvider, then sgotel.GuardOptions()).
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())

	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	g := guard.New(rdb, sgotel.GuardOptions(sgotel.WithTracerProvider(tp))...)
	defer g.Close()

	r := gin.New()
	r.POST("/api/seckill/:sku", g.Lock("example:sku:<sku>"), func(c *gin.Context) {
		c.Status(http.StatusCreated)
	})
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/api/seckill/42", nil))

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, s.Attributes[0].Value.Emit())
	}
	// Output:
	// lock.wait mutex
	// guard.lock /api/seckill/:sku
	// guard.handler /api/seckill/:sku
	// lock.hold mutex
}

// The holds of a lock Client of your own.
func ExampleNewLockTracer() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb, lock.WithObserver(sgotel.NewLockTracer().Observe))
	defer locks.Close()

	ctx, err := locks.Mutex("example:report").Lock(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Mutex("example:report").Unlock(ctx)
	// ... the work: a "lock.wait" span has ended, "lock.hold" ends with
	// the Unlock.
}

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// BenchmarkPurchase runs purchases through the service's handler in this
// process (no HTTP transport), every one by a new buyer on one of 1,024
// SKUs, in mode none, guard, and guard with an Idempotency-Key, on a
// redis-server of its own and MariaDB: what the service's own code costs a
// request, for a CPU profile of the guarded path:
//
//	go test -run '^$' -bench Purchase -benchtime 3000x -cpuprofile cpu.out ./example-seckill/
//	go tool pprof -top -cum cpu.out
func BenchmarkPurchase(b *testing.B) {
	rs := testenv.Redis(b)
	backends, err := OpenBackends(env(map[string]string{envRedisURL: "redis://" + rs.Addr, envMySQLDSN: testenv.MySQL(b)}), "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(backends.Close)
	backends.Quiet()
	ctx := context.Background()
	for _, row := range []struct {
		name string
		mode Mode
		idem bool
	}{{"none", ModeNone, false}, {"guard", ModeGuard, false}, {"guard-idempotency-key", ModeGuard, true}} {
		b.Run(row.name, func(b *testing.B) {
			cfg := Config{Mode: row.mode, HoldRate: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if row.mode.guarded() {
				p, _, err := (&knobs{}).loadPolicies()
				if err != nil {
					b.Fatal(err)
				}
				cfg.Policies = p
			}
			in, err := startInstance(ctx, backends, cfg, "127.0.0.1:0", true)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(in.stop)
			skus := 1024
			if n, err := strconv.Atoi(os.Getenv("PURCHASE_SKUS")); err == nil && n > 0 {
				skus = n // PURCHASE_SKUS=1: one hot SKU
			}
			for i := range skus {
				in.db.Save(&Product{SKU: "b-" + strconv.Itoa(i), Name: "bench", Stock: 1_000_000_000})
			}
			h := in.svc.Handler()
			var users atomic.Int64
			prefix := fmt.Sprintf("%s-%d-", row.name, time.Now().UnixNano())
			b.SetParallelism(8) // 16 in flight on 2 cores: the handler waits on Redis and MariaDB
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					u := users.Add(1)
					req := httptest.NewRequest(http.MethodPost, "/api/seckill/b-"+strconv.Itoa(int(u%int64(skus))), nil)
					req.Header.Set("X-User-ID", prefix+strconv.FormatInt(u, 10))
					if row.idem {
						req.Header.Set("Idempotency-Key", "k"+strconv.FormatInt(u, 10))
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != http.StatusCreated && w.Code != http.StatusTooManyRequests {
						b.Errorf("purchase: %d %s", w.Code, w.Body)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

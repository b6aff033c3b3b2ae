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
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// BenchmarkPurchase runs purchases through the service's handler in this
// process (no HTTP transport), every one by a new buyer on one of 1,024
// SKUs, in mode none, local, guard, and guard with an Idempotency-Key, on a
// redis-server of its own and MariaDB: what the service's own code costs a
// request, for a CPU profile of the guarded path:
//
//	go test -run '^$' -bench Purchase -benchtime 3000x -cpuprofile cpu.out ./example-seckill/
//	go tool pprof -top -cum cpu.out
//
// Besides the CPU per purchase it reports the commands Redis ran per
// purchase (INFO commandstats, the commands scripts run included) and, in
// the guard modes, the mean time the lock was held around the handler
// (seckillguard_lock_hold_seconds): with PURCHASE_SKUS=1 the purchases run
// one at a time, so ns/op is that hold plus the handover to the next
// holder, whatever CPU is left idle. Mode local (one sync.Mutex for the
// process, the same number of statements) is then the floor of any lock
// that serialises the purchases: what they cost with a lock that costs
// nothing.
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
	}{{"none", ModeNone, false}, {"local", ModeLocal, false}, {"guard", ModeGuard, false}, {"guard-idempotency-key", ModeGuard, true}} {
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
			hold0, cmds0 := holdSeconds(b, in.svc), redisCommands(b, in.rdb)
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
			b.ReportMetric(float64(redisCommands(b, in.rdb)-cmds0)/float64(b.N), "redis-cmds/op")
			if row.mode.guarded() {
				b.ReportMetric((holdSeconds(b, in.svc)-hold0)*1e6/float64(b.N), "hold-µs/op")
			}
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

// holdSeconds returns the total time the service's lock middleware has held
// locks around its handlers so far (the sum of
// seckillguard_lock_hold_seconds).
func holdSeconds(b *testing.B, svc *Service) float64 {
	mfs, err := svc.Registry().Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "seckillguard_lock_hold_seconds" {
			for _, m := range mf.GetMetric() {
				total += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return total
}

// redisCommands returns the commands Redis has run so far (INFO
// commandstats; a script call counts as EVALSHA and again for each command
// it runs), INFO itself excluded.
func redisCommands(b *testing.B, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_<name>:calls=<n>,usec=...
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok || name == "info" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		total += n
	}
	return total
}

package lock_test

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// BenchmarkMutex_Uncontended measures one Lock+Unlock with nobody else
// around: two round trips.
func BenchmarkMutex_Uncontended(b *testing.B) {
	srv := testenv.Redis(b)
	sent := testenv.NewCommandCounter()
	rdb := srv.Client()
	rdb.AddHook(sent)
	c := lock.New(rdb)
	defer c.Close()
	m := c.Mutex("bench:uncontended")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	before := sent.Total()
	for i := 0; i < b.N; i++ {
		held, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(held); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sent.Total()-before)/float64(b.N), "roundtrips/op")
}

// BenchmarkMutex_OwnCode measures what the Mutex's own code costs a
// Lock+Unlock, without the network: a go-redis hook answers its two scripts
// (the acquisition with the next block's token, the release with 0), so
// what is left is the client side alone. Profile it with -cpuprofile to see
// where the time over the contract's Redis work goes (docs/BENCHMARKS.md,
// "The uncontended row, taken apart").
func BenchmarkMutex_OwnCode(b *testing.B) {
	srv := testenv.Redis(b)
	rdb := srv.Client()
	rdb.AddHook(&answeringScripts{})
	c := lock.New(rdb)
	defer c.Close()
	cycle, err := lockUnlockCycle(c.Mutex("bench:owncode"))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cycle()
	}
	if *err != nil {
		b.Fatal(*err)
	}
}

// answeringScripts is a go-redis hook that answers the Mutex's acquire and
// release scripts itself, as Redis would for a lock nobody else holds.
type answeringScripts struct{ token atomic.Int64 }

var (
	isAcquire = scriptCall("redisson_lock_token:")
	isUnlock  = scriptCall("redisson_lock__channel:")
)

func (h *answeringScripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *answeringScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *answeringScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := cmd.(*redis.Cmd)
		switch {
		case ok && isAcquire(cmd):
			c.SetVal(h.token.Add(16) + 1<<40)
			return nil
		case ok && isUnlock(cmd):
			c.SetVal(int64(0))
			return nil
		}
		return next(ctx, cmd)
	}
}

// BenchmarkMutex_HotKey4x16 runs 4 Clients (instances) x 16 goroutines on one
// lock with a 200µs critical section and reports the commands each
// acquisition costs and the 99th percentile of the wait.
func BenchmarkMutex_HotKey4x16(b *testing.B) {
	srv := testenv.Redis(b)
	const clients, goroutines = 4, 16
	sent := testenv.NewCommandCounter()
	cs := make([]*lock.Client, clients)
	for i := range cs {
		rdb := srv.Client()
		rdb.AddHook(sent)
		cs[i] = lock.New(rdb)
		defer cs[i].Close()
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var mu sync.Mutex
	var waits []time.Duration
	b.ResetTimer()
	before := sent.Total()
	var wg sync.WaitGroup
	for _, c := range cs {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex("bench:hot")
				var mine []time.Duration
				for left.Add(-1) >= 0 {
					start := time.Now()
					ctx, err := m.Lock(context.Background())
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
					work(200 * time.Microsecond)
					m.Unlock(ctx)
				}
				mu.Lock()
				waits = append(waits, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(sent.Total()-before)/float64(b.N), "cmds/acq")
	if len(waits) > 0 {
		sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
		b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "p99-wait-ms")
	}
}

// work stands for a critical section of d. time.Sleep is far too coarse for
// 200µs on most machines (it often sleeps a millisecond), so it spins.
func work(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

package lock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// fairHotCost runs waiters goroutines over two Clients, each locking and
// unlocking one FairMutex in a loop, so the line stays waiters-1 long, and
// returns the commands Redis ran per acquisition (those the scripts run
// included: INFO commandstats) over acquisitions acquisitions taken once
// every waiter stands in line.
func fairHotCost(t *testing.T, srv *testenv.RedisServer, waiters, acquisitions int) float64 {
	t.Helper()
	clients := instances(t, srv, 2)
	rdb := srv.Client()
	defer rdb.Close()
	name := fmt.Sprintf("%s:%d", lockName(t), waiters)
	warm := 2 * waiters // every waiter has had its turn and queued again
	end := warm + acquisitions
	var (
		mu            sync.Mutex
		taken         int
		before, after map[string]int64
		statsErr      error
	)
	stats := func() map[string]int64 {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			statsErr = err
		}
		return parseCommandStats(info)
	}
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := clients[i%len(clients)].FairMutex(name)
			for {
				ctx, err := m.Lock(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				taken++
				n := taken
				switch n {
				case warm:
					before = stats()
				case end:
					after = stats()
				}
				mu.Unlock()
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
				if n >= end {
					return
				}
			}
		}()
	}
	wg.Wait()
	if statsErr != nil {
		t.Fatal(statsErr)
	}
	if t.Failed() {
		t.FailNow()
	}
	var ran int64
	for k, v := range delta(before, after) {
		if k != "info" {
			ran += v
		}
	}
	return float64(ran) / float64(acquisitions)
}

// parseCommandStats reads INFO commandstats: how many times each command ran.
func parseCommandStats(info string) map[string]int64 {
	out := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		if n, err := strconv.ParseInt(num, 10, 64); err == nil {
			out[name] = n
		}
	}
	return out
}

// A contended FairMutex acquisition costs Redis the same number of commands
// however long the line: no call reads every waiter's liveness or deadline
// (the liveness purge reads only the places that ran out; an acquisition
// lowers every deadline with one read and one write; a waiter behind others
// bounds its wait by the first waiter and our earliest liveness only).
func TestFairMutex_ContendedCostDoesNotGrowWithTheLine(t *testing.T) {
	srv := testenv.Redis(t)
	const acquisitions = 150
	short := fairHotCost(t, srv, 4, acquisitions)
	long := fairHotCost(t, srv, 40, acquisitions)
	t.Logf("Redis commands per contended acquisition: %.1f with 4 waiters, %.1f with 40", short, long)
	if long > short+8 {
		t.Fatalf("%.1f commands per acquisition with 40 waiters against %.1f with 4: the cost grows with the line", long, short)
	}
}

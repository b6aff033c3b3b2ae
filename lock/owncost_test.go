package lock_test

import (
	"testing"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// The allocations of the Mutex's own code in a Lock+Unlock, go-redis
// answering its two scripts from a hook (as BenchmarkMutex_OwnCode): the
// hold, its field boxed for the script arguments and its context's
// cancellation, plus go-redis' command per script call and the boxed reply.
// Measured 7 (14 before the hold kept its semaphore, field bytes, argument
// list, token context and detached release context beside it).
func TestCost_OwnCodeAllocatesAtMost8Times(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	rdb.AddHook(&answeringScripts{})
	c := lock.New(rdb)
	defer c.Close()
	cycle, err := lockUnlockCycle(c.Mutex(lockName(t)))
	cycle()
	allocs := testing.AllocsPerRun(500, cycle)
	if *err != nil {
		t.Fatal(*err)
	}
	t.Logf("%.1f allocations per Lock+Unlock of the Mutex's own code", allocs)
	if allocs > 8 {
		t.Fatalf("%.1f allocations per Lock+Unlock of the Mutex's own code, want at most 8", allocs)
	}
}

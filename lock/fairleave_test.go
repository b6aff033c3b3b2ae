package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A FairMutex waiter that gives up while its leave cannot reach Redis
// leaves the line once Redis answers again: the leave is retried in the
// background. Redisson's line keys have no expiry, so without the retry its
// place would stay in them for good on a name nobody calls again.
func TestFairMutex_AWaiterWhoseLeaveFailedLeavesTheLineLater(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	queue, timeouts := fairKeys(name)
	holder := lock.New(srv.Client())
	defer holder.Close()
	refuse := &refusedCalls{match: isFairLeave, dial: true}
	rdb := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	rdb.AddHook(refuse)
	c := lock.New(rdb)
	defer c.Close()
	ctx := context.Background()
	hctx, err := holder.FairMutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refuse.left.Store(1)
	if _, err := c.FairMutex(name).TryLock(ctx, 100*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock beside the holder = %v, want ErrNotAcquired", err)
	}
	if refuse.left.Load() >= 1 {
		t.Fatal("no leave was refused: the scenario did not happen")
	}
	// Nothing else calls on the name meanwhile: only the retried leave can
	// take the place out (its liveness lasts the 30 s watchdog timeout).
	eventually(t, 2*time.Second, "the waiter's place is gone from Redisson's line keys", func() bool {
		return srv.Do("EXISTS", queue, timeouts) == int64(0)
	})
	if err := holder.FairMutex(name).Unlock(hctx); err != nil {
		t.Fatal(err)
	}
}

// isFairLeave matches fair_leave.lua: the six keys of a fair line, then the
// owner field, the publish command, the drop flag, the wait and the clock.
func isFairLeave(cmd redis.Cmder) bool {
	args := cmd.Args()
	if cmd.Name() != "evalsha" || len(args) != 14 || args[2] != 6 {
		return false
	}
	q, _ := args[4].(string)
	drop, _ := args[11].(string)
	return strings.HasPrefix(q, "redisson_lock_queue:") && (drop == "0" || drop == "1")
}

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/lock"
)

// The whole lock: take it with a bounded wait, work under its context, release it.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb) // one per process; renews every lock it holds
	defer locks.Close()

	m := locks.Mutex("sku:42")
	ctx, err := m.TryLock(context.Background(), 2*time.Second) // wait at most 2s
	if errors.Is(err, lock.ErrNotAcquired) {
		fmt.Println("busy, try again")
		return
	}
	if err != nil {
		log.Fatal(err) // Redis unreachable, or the caller gave up
	}
	defer m.Unlock(ctx)

	// ctx is cancelled with cause lock.ErrLost if the lock is ever lost, and
	// carries the fencing token that storage uses to refuse stale writes.
	token, _ := fencing.FromContext(ctx)
	fmt.Println("holding sku:42, token issued:", token > 0)
	// Output: holding sku:42, token issued: true
}

// Re-entering through the lock's context: method A locks, calls method B,
// which locks the same name again without deadlocking.
func ExampleMutex_Lock_reentrant() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.Mutex("order:1001")

	methodB := func(ctx context.Context) {
		ctx, err := m.Lock(ctx) // re-enters: ctx already holds the lock
		if err != nil {
			log.Fatal(err)
		}
		defer m.Unlock(ctx) // one Unlock per Lock
		n, _ := m.HoldCount(ctx)
		fmt.Println("levels held in B:", n)
	}

	ctx, err := m.Lock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	methodB(ctx)
	n, _ := m.HoldCount(ctx)
	fmt.Println("levels held in A:", n)
	m.Unlock(ctx)
	// Output:
	// levels held in B: 2
	// levels held in A: 1
}

// A fixed lease turns the watchdog off; the context says when it ran out.
func ExampleWithLease() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.Mutex("report:nightly")

	ctx, err := m.Lock(context.Background(), lock.WithLease(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done() // the work took longer than the lease
	fmt.Println(errors.Is(context.Cause(ctx), lock.ErrLost))
	fmt.Println(errors.Is(m.Unlock(ctx), lock.ErrLost))
	// Output:
	// true
	// true
}

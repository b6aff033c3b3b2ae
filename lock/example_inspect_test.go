package lock_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/lock"
)

// Who holds a lock, how many times, and who waits: read from Redis without
// taking anything, for any Client's or Redisson's locks.
func ExampleClient_Inspect() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()

	m := locks.Mutex("sku:4242")
	ctx, _ := m.Lock(context.Background())
	ctx, _ = m.Lock(ctx) // re-entered: two Unlocks free it
	defer m.Unlock(ctx)
	defer m.Unlock(ctx)

	in, err := locks.Inspect(context.Background(), "sku:4242")
	if err != nil {
		log.Fatal(err)
	}
	for _, o := range in.Owners {
		fmt.Println("held by this Client:", o.ClientID == locks.ID(), "holds:", o.Holds)
	}
	fmt.Println("lease left:", in.Lease > 0, "token:", in.Token > 0, "fair waiters:", in.QueueLen)
	// Output:
	// held by this Client: true holds: 2
	// lease left: true token: true fair waiters: 0
}

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

// First come, first served across every instance: waiters are granted the
// lock in the order they asked, and an unlock wakes only the next one.
func ExampleFairMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.FairMutex("ticket:queue")

	ctx, err := m.TryLock(context.Background(), 2*time.Second)
	if err != nil {
		log.Fatal(err) // lock.ErrNotAcquired: still not our turn after 2s
	}
	defer m.Unlock(ctx)
	fmt.Println("our turn")
	// Output: our turn
}

// Many readers or one writer; a waiting writer keeps new readers out.
func ExampleRWMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	rw := locks.RWMutex("product:101:config")

	r1, _ := rw.RLock(context.Background())
	r2, _ := rw.RLock(context.Background()) // another reader: shares the lock
	_, err := rw.TryLock(context.Background(), 100*time.Millisecond)
	fmt.Println("writer while reading:", errors.Is(err, lock.ErrNotAcquired))
	_, err = rw.Lock(r1) // a reader asking to write would wait for itself
	fmt.Println("upgrade refused:", errors.Is(err, lock.ErrUpgrade))
	rw.RUnlock(r2)
	rw.RUnlock(r1)

	w, err := rw.Lock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	token, _ := fencing.FromContext(w) // writes are fenced; reads carry no token
	fmt.Println("writing, token issued:", token > 0)
	rw.Unlock(w)
	// Output:
	// writer while reading: true
	// upgrade refused: true
	// writing, token issued: true
}

// Stock and balance together or not at all. The hash tag puts both locks in
// one Cluster slot, so the pair is taken by one script even on a Cluster.
func ExampleMultiLock() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	pair := locks.MultiLock("{order:1001}:stock", "{order:1001}:balance")

	ctx, err := pair.TryLock(context.Background(), 2*time.Second)
	if err != nil {
		log.Fatal(err) // on failure none of the locks is held
	}
	defer pair.Unlock(ctx)
	// One token fences writes to either resource.
	token, _ := fencing.FromContext(ctx)
	fmt.Println("both held, token issued:", token > 0)
	// Output: both held, token issued: true
}

// At most two concurrent checkouts per SKU across every instance; the
// permit of an instance that dies comes back after its lease.
func ExampleSemaphore() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	checkouts := locks.Semaphore("checkout:sku:42", 2)

	a, _ := checkouts.Acquire(context.Background())
	b, _ := checkouts.Acquire(context.Background())
	_, err := checkouts.TryAcquire(context.Background(), 0)
	fmt.Println("third checkout busy:", errors.Is(err, lock.ErrNotAcquired))
	checkouts.Release(b)
	c, err := checkouts.TryAcquire(context.Background(), time.Second)
	fmt.Println("after a release:", err == nil)
	checkouts.Release(c)
	checkouts.Release(a)
	// Output:
	// third checkout busy: true
	// after a release: true
}

// A RedLock over three independent masters: held while a majority holds it.
func ExampleNewRedLock() {
	var nodes []*lock.Client
	for _, env := range []string{"REDIS_ADDR", "REDIS_ADDR2", "REDIS_ADDR3"} {
		c := lock.New(redis.NewClient(&redis.Options{Addr: os.Getenv(env)}))
		defer c.Close()
		nodes = append(nodes, c)
	}
	rl := lock.NewRedLock("payout:7", nodes...)

	ctx, err := rl.TryLock(context.Background(), 2*time.Second)
	if errors.Is(err, lock.ErrNoQuorum) {
		log.Fatal("fewer than 2 of 3 nodes reachable")
	}
	if err != nil {
		log.Fatal(err)
	}
	defer rl.Unlock(ctx)
	// Timing alone cannot make a RedLock safe: fence the writes with its
	// token, which grows across acquisitions even as nodes come and go.
	token, _ := fencing.FromContext(ctx)
	fmt.Printf("held on a quorum of %d, token issued: %v\n", rl.Quorum(), token > 0)
	// Output: held on a quorum of 2, token issued: true
}

// Replica acknowledgement: an acquisition that fewer replicas confirm is
// undone, so a failover cannot silently lose it. This server has none.
func ExampleWithReplicas() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.Mutex("ledger:close")

	_, err := m.Lock(context.Background(), lock.WithReplicas(1, 50*time.Millisecond))
	fmt.Println(errors.Is(err, lock.ErrNotReplicated))
	locked, _ := m.IsLocked(context.Background())
	fmt.Println("left locked:", locked)
	// Output:
	// true
	// left locked: false
}

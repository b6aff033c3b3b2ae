package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
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

	token, _ := fencing.FromContext(ctx) // for the database to refuse stale writes
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

// Fanning out under one request: the goroutines share the request's lock
// context, but each acquisition of another lock is a hold of its own, so
// they exclude each other on it. A context that descends from an acquisition
// of the inner lock would re-enter it instead.
func ExampleMutex_fanOut() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()

	req, err := locks.Mutex("order:2002").Lock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Mutex("order:2002").Unlock(req)

	inner := locks.Mutex("stock:sku-7")
	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, err := inner.Lock(req) // req holds order:2002, not stock:sku-7
			if err != nil {
				log.Fatal(err)
			}
			defer inner.Unlock(ctx)
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
		}()
	}
	wg.Wait()
	fmt.Println("goroutines inside stock:sku-7 at once:", most)
	// Output: goroutines inside stock:sku-7 at once: 1
}

// A hold ends with the context it was taken with: when the request ends
// without an Unlock, the lock is released all the same.
func ExampleMutex_Lock_endsWithItsContext() {
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	locks := lock.New(rdb)
	defer locks.Close()
	m := locks.Mutex("cart:3003")

	request, cancel := context.WithCancel(context.Background())
	held, err := m.Lock(request)
	if err != nil {
		log.Fatal(err)
	}
	cancel() // the client went away; nobody called Unlock
	<-held.Done()

	// Another request gets the lock at once, not after its 30s lease.
	ctx, err := m.TryLock(context.Background(), 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("taken again:", ctx.Err() == nil)
	m.Unlock(ctx)
	fmt.Println("late Unlock of the ended hold:", m.Unlock(held))
	// Output:
	// taken again: true
	// late Unlock of the ended hold: <nil>
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

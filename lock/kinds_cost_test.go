package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A lockKind takes and releases one lock of some kind with a context.
type lockKind struct {
	name string
	take func(c *lock.Client, ctx context.Context, wait time.Duration) (context.Context, error)
	drop func(c *lock.Client, ctx context.Context) error
}

func kinds(name string) []lockKind {
	return []lockKind{
		{"Mutex",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.Mutex(name).TryLock(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error { return c.Mutex(name).Unlock(ctx) }},
		{"FairMutex",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.FairMutex(name+":fair").TryLock(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error { return c.FairMutex(name + ":fair").Unlock(ctx) }},
		{"RWMutex.RLock",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.RWMutex(name+":rw").TryRLock(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error { return c.RWMutex(name + ":rw").RUnlock(ctx) }},
		{"RWMutex.Lock",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.RWMutex(name+":rw").TryLock(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error { return c.RWMutex(name + ":rw").Unlock(ctx) }},
		{"Semaphore",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.Semaphore(name+":sem", 1).TryAcquire(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error { return c.Semaphore(name+":sem", 1).Release(ctx) }},
		{"MultiLock(3)",
			func(c *lock.Client, ctx context.Context, w time.Duration) (context.Context, error) {
				return c.MultiLock(name+":a", name+":b", name+":c").TryLock(ctx, w)
			},
			func(c *lock.Client, ctx context.Context) error {
				return c.MultiLock(name+":a", name+":b", name+":c").Unlock(ctx)
			}},
	}
}

func TestCost_EveryKindIsOneRoundTripEachWayUncontended(t *testing.T) {
	srv := testenv.Redis(t)
	sent := testenv.NewCommandCounter()
	rdb := srv.Client()
	rdb.AddHook(sent)
	c := lock.New(rdb)
	defer c.Close()
	bg := context.Background()
	for _, k := range kinds(lockName(t)) {
		warm, err := k.take(c, bg, 0) // loads the scripts
		if err != nil {
			t.Fatal(err)
		}
		k.drop(c, warm)
		const n = 20
		before := sent.Total()
		for i := 0; i < n; i++ {
			ctx, err := k.take(c, bg, 0)
			if err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
			if err := k.drop(c, ctx); err != nil {
				t.Fatalf("%s: %v", k.name, err)
			}
		}
		per := float64(sent.Total()-before) / n
		t.Logf("%-14s %.1f commands per uncontended acquire+release", k.name, per)
		if per != 2 {
			t.Errorf("%s: %.1f commands per acquire+release, want 2", k.name, per)
		}
	}
}

func TestCost_RedLockIsTwoRoundTripsPerNodeToAcquire(t *testing.T) {
	nodes := redisNodes(t, 3)
	counters := make([]*testenv.CommandCounter, len(nodes))
	clients := make([]*lock.Client, len(nodes))
	for i, n := range nodes {
		counters[i] = testenv.NewCommandCounter()
		r := n.Client()
		r.AddHook(counters[i])
		clients[i] = lock.New(r)
		t.Cleanup(func() { clients[i].Close() })
	}
	rl := lock.NewRedLock(lockName(t), clients...)
	warm, err := rl.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rl.Unlock(warm)
	total := func() (n int64) {
		for _, c := range counters {
			n += c.Total()
		}
		return n
	}
	const rounds = 10
	before := total()
	for i := 0; i < rounds; i++ {
		ctx, err := rl.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := rl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	per := float64(total()-before) / rounds
	t.Logf("RedLock over 3 nodes: %.1f commands per acquire+release (acquire and token raise in parallel per node, release per node)", per)
	if per > 3*3 {
		t.Fatalf("%.1f commands per RedLock acquire+release, want at most 9", per)
	}
}

func TestClient_WaitersOfEveryKindThatGiveUpLeaveNoGoroutines(t *testing.T) {
	srv := testenv.Redis(t)
	nodes := redisNodes(t, 2)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	name := lockName(t)
	opt := lock.WithWatchdogTimeout(2 * time.Second)
	holder := lock.New(srv.Client(), opt)
	bg := context.Background()
	var held []func()
	for _, k := range kinds(name) {
		if k.name == "RWMutex.RLock" {
			continue // the writer below holds it
		}
		ctx, err := k.take(holder, bg, 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, func() { k.drop(holder, ctx) })
	}
	redHolder := []*lock.Client{lock.New(nodes[0].Client(), opt), lock.New(nodes[1].Client(), opt)}
	rctx, err := lock.NewRedLock(name, redHolder...).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		c := lock.New(srv.Client(), opt)
		for _, k := range kinds(name) {
			if _, err := k.take(c, bg, 20*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
				t.Fatalf("%s: %v, want ErrNotAcquired", k.name, err)
			}
		}
		rc := []*lock.Client{lock.New(nodes[0].Client(), opt), lock.New(nodes[1].Client(), opt)}
		if _, err := lock.NewRedLock(name, rc...).TryLock(bg, 20*time.Millisecond); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("RedLock: %v, want ErrNotAcquired", err)
		}
		c.Close()
		for _, x := range rc {
			x.Close()
		}
	}
	for _, f := range held {
		f()
	}
	lock.NewRedLock(name, redHolder...).Unlock(rctx)
	holder.Close()
	for _, x := range redHolder {
		x.Close()
	}
	if n := srv.Do("EXISTS", fmt.Sprintf("redisson_lock_queue:{%s:fair}", name)); n != int64(0) {
		t.Fatal("fair line left behind by waiters that gave up")
	}
}

package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// redisNodes starts n independent redis-servers.
func redisNodes(t *testing.T, n int) []*testenv.RedisServer {
	t.Helper()
	out := make([]*testenv.RedisServer, n)
	for i := range out {
		out[i] = testenv.Redis(t)
	}
	return out
}

// redLockProcess returns the Clients one process would have: one per node,
// quick to give up on a node that is down.
func redLockProcess(t *testing.T, nodes []*testenv.RedisServer, opts ...lock.Option) []*lock.Client {
	t.Helper()
	out := make([]*lock.Client, len(nodes))
	for i, n := range nodes {
		c := lock.New(n.Client(func(o *redis.Options) {
			o.MaxRetries = -1
			o.DialTimeout = 200 * time.Millisecond
		}), opts...)
		t.Cleanup(func() { c.Close() })
		out[i] = c
	}
	return out
}

func TestRedLock_WorksWithAMinorityDownAndRefusesWithout(t *testing.T) {
	nodes := redisNodes(t, 5)
	name := lockName(t)
	rl := lock.NewRedLock(name, redLockProcess(t, nodes)...)
	other := lock.NewRedLock(name, redLockProcess(t, nodes)...)
	nodes[1].Kill()
	nodes[3].Kill() // two of five down: three is still a majority
	ctx, err := rl.TryLock(context.Background(), time.Second)
	if err != nil {
		t.Fatalf("with 2 of 5 nodes down: %v", err)
	}
	if _, err := other.TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a second holder with 2 of 5 nodes down: %v", err)
	}
	held := 0
	for _, i := range []int{0, 2, 4} {
		if nodes[i].Do("EXISTS", name) == int64(1) {
			held++
		}
	}
	if held != 3 {
		t.Fatalf("lock on %d live nodes, want all 3", held)
	}
	if err := rl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	nodes[4].Kill() // three of five down
	start := time.Now()
	_, err = rl.TryLock(context.Background(), 5*time.Second)
	if !errors.Is(err, lock.ErrNoQuorum) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("with 3 of 5 nodes down = %v, want ErrNoQuorum", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refused after %v: an outage must not look like contention", d)
	}
	for _, i := range []int{0, 2} {
		if nodes[i].Do("EXISTS", name) != int64(0) {
			t.Fatalf("a refused RedLock left node %d locked", i)
		}
	}
}

func TestRedLock_LosingTheMajorityCancelsTheContext(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	rl := lock.NewRedLock(name, redLockProcess(t, nodes, lock.WithWatchdogTimeout(time.Second))...)
	ctx, err := rl.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	nodes[0].Kill() // one of three: still a majority
	time.Sleep(2200 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("lost with 2 of 3 nodes renewed: %v", context.Cause(ctx))
	}
	nodes[1].Kill()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder never learned that it lost its majority")
	}
	cause := context.Cause(ctx)
	if !errors.Is(cause, lock.ErrLost) || !errors.Is(cause, lock.ErrNoQuorum) {
		t.Fatalf("cause %v, want ErrLost and ErrNoQuorum", cause)
	}
	if err := rl.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock = %v, want ErrLost", err)
	}
	// Released at once; a release that failed (its node call timed out on a
	// busy machine, say) is retried in the background within 50 ms. The
	// node was renewed at most a third of its 1 s lease before the loss, so
	// its own expiry cannot free it this soon.
	eventually(t, 300*time.Millisecond, "the surviving node is released, well before its lease ends", func() bool {
		return nodes[2].Do("EXISTS", name) == int64(0)
	})
}

// A RedLock that lost its majority releases the node left at once; when
// that release fails (a connection lost on the way, say), it is retried in
// the background, as a Mutex's failed final release is, rather than left
// held by nobody until its lease ends.
func TestRedLock_AFailedReleaseOfTheNodeLeftIsRetried(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	clients := redLockProcess(t, nodes[:2], lock.WithWatchdogTimeout(3*time.Second))
	refused := &refusedCalls{match: isRelease, dial: true}
	rdb := nodes[2].Client(func(o *redis.Options) { o.MaxRetries = -1 })
	rdb.AddHook(refused)
	left := lock.New(rdb, lock.WithWatchdogTimeout(3*time.Second))
	t.Cleanup(func() { left.Close() })
	rl := lock.NewRedLock(name, append(clients, left)...)
	ctx, err := rl.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	refused.left.Store(1)
	nodes[0].Kill()
	nodes[1].Kill()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the holder never learned that it lost its majority")
	}
	eventually(t, time.Second, "the node left is released, well before its lease of 3s ends", func() bool {
		return nodes[2].Do("EXISTS", name) == int64(0)
	})
	if n := refused.left.Load(); n >= 1 {
		t.Fatal("no release of the node left was refused: the scenario did not happen")
	}
	if err := rl.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock = %v, want ErrLost", err)
	}
}

func TestRedLock_TokensIncreaseAndBeatEveryNodesCounter(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	a := lock.NewRedLock(name, redLockProcess(t, nodes)...)
	b := lock.NewRedLock(name, redLockProcess(t, nodes)...)
	// One node's counter is far ahead of the others (and of the clocks).
	nodes[2].Do("SET", "redisson_lock_token:{"+name+"}", "7000000000000000")
	var last fencing.Token
	for i := 0; i < 6; i++ {
		rl := a
		if i%2 == 1 {
			rl = b
		}
		if i == 3 {
			nodes[2].Kill() // the node with the big counter leaves
		}
		ctx, err := rl.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok, ok := fencing.FromContext(ctx)
		if !ok || tok <= last {
			t.Fatalf("acquisition %d: token %d, want above %d", i, tok, last)
		}
		if i == 0 && tok <= 7000000000000000 {
			t.Fatalf("token %d, want above the largest counter of the majority", tok)
		}
		last = tok
		inner, err := rl.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if it, _ := fencing.FromContext(inner); it != tok {
			t.Fatalf("re-entry token %d, want %d", it, tok)
		}
		rl.Unlock(inner)
		if err := rl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRedLock_UnlockWakesAWaiterAtOnce(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	a := lock.NewRedLock(name, redLockProcess(t, nodes)...)
	b := lock.NewRedLock(name, redLockProcess(t, nodes)...) // 30s leases
	held, err := a.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		ctx, err := b.Lock(context.Background())
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		b.Unlock(ctx)
	}()
	time.Sleep(150 * time.Millisecond)
	released := time.Now()
	if err := a.Unlock(held); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	if d := at.Sub(released); d > 500*time.Millisecond {
		t.Fatalf("waiter got the RedLock %v after the unlock", d)
	}
}

func TestRedLock_CrashedHolderIsReplacedAfterTheLease(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	opt := lock.WithWatchdogTimeout(time.Second)
	dying := redLockProcess(t, nodes, opt)
	if _, err := lock.NewRedLock(name, dying...).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	for _, c := range dying {
		c.Close()
	}
	ctx, err := lock.NewRedLock(name, redLockProcess(t, nodes, opt)...).TryLock(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(crashed); d > 2500*time.Millisecond {
		t.Fatalf("taken %v after the crash, want about the 1s lease", d)
	}
	_ = ctx
}

func TestRedLock_RejectsBadInput(t *testing.T) {
	nodes := redisNodes(t, 2)
	cs := redLockProcess(t, nodes)
	bg := context.Background()
	var nilRL *lock.RedLock
	cases := map[string]func() error{
		"no clients":      func() error { _, err := lock.NewRedLock("x").Lock(bg); return err },
		"nil client":      func() error { _, err := lock.NewRedLock("x", cs[0], nil).Lock(bg); return err },
		"repeated client": func() error { _, err := lock.NewRedLock("x", cs[0], cs[0]).Lock(bg); return err },
		"empty name":      func() error { _, err := lock.NewRedLock("", cs...).Lock(bg); return err },
		"negative wait":   func() error { _, err := lock.NewRedLock("x", cs...).TryLock(bg, -1); return err },
		"zero lease":      func() error { _, err := lock.NewRedLock("x", cs...).Lock(bg, lock.WithLease(0)); return err },
		"replica acks": func() error {
			_, err := lock.NewRedLock("x", cs...).Lock(bg, lock.WithReplicas(1, time.Second))
			return err
		},
		"nil context":    func() error { _, err := lock.NewRedLock("x", cs...).Lock(nil); return err }, //nolint:staticcheck
		"nil redlock":    func() error { _, err := nilRL.Lock(bg); return err },
		"unlock nil ctx": func() error { return lock.NewRedLock("x", cs...).Unlock(nil) }, //nolint:staticcheck
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if err := lock.NewRedLock("x", cs...).Unlock(bg); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Unlock without a hold = %v, want ErrNotHeld", err)
	}
	for i, n := range nodes {
		if v := n.Do("DBSIZE"); v != int64(0) {
			t.Fatalf("bad input created %v keys on node %d", v, i)
		}
	}
}

func TestRedLock_UnlockAfterANodesClientClosedReleasesTheRest(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	// The Clients' replica acknowledgement default does not apply to a RedLock.
	cs := redLockProcess(t, nodes, lock.WithReplicaAck(1, 50*time.Millisecond))
	rl := lock.NewRedLock(name, cs...)
	ctx, err := rl.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cs[0].Close() // one node given up: two of three still hold it
	time.Sleep(50 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("closing one node's Client lost the RedLock: %v", context.Cause(ctx))
	}
	if err := rl.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	for i, n := range nodes[1:] {
		if n.Do("EXISTS", name) != int64(0) {
			t.Fatalf("node %d still locked", i+1)
		}
	}
}

// A RedLock over Clients with different watchdog timeouts keeps every node
// renewed within the lease that node was given: held for several leases of
// the shortest timeout without a fault, it is neither lost nor taken by
// another RedLock.
func TestRedLock_ClientsWithDifferentWatchdogTimeoutsKeepEveryNode(t *testing.T) {
	nodes := redisNodes(t, 3)
	name := lockName(t)
	process := func() []*lock.Client {
		out := make([]*lock.Client, len(nodes))
		for i := range nodes {
			timeout := 3 * time.Second
			if i == 0 {
				timeout = 600 * time.Millisecond
			}
			out[i] = redLockProcess(t, nodes[i:i+1], lock.WithWatchdogTimeout(timeout))[0]
		}
		return out
	}
	pa, pb := process(), process()
	// A lease of 600ms gives each node call 60ms: connect and load the
	// scripts first, so that a slow first call is not taken for an outage.
	for _, p := range [][]*lock.Client{pa, pb} {
		warm := lock.NewRedLock(name+":warm", p...)
		for try := 0; ; try++ {
			ctx, err := warm.TryLock(context.Background(), 0)
			if err == nil {
				warm.Unlock(ctx)
				break
			}
			if try == 20 {
				t.Fatal(err)
			}
		}
	}
	a, b := lock.NewRedLock(name, pa...), lock.NewRedLock(name, pb...)
	ctx, err := a.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second) // more than three leases of 600ms
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			t.Fatalf("lost without a fault: %v", context.Cause(ctx))
		}
		if bctx, err := b.TryLock(context.Background(), 0); err == nil {
			b.Unlock(bctx)
			t.Fatalf("another RedLock got a majority while the first holds (first told: %v)", ctx.Err() != nil)
		} else if !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A RedLock that re-enters a Mutex its context holds on one node, while a
// goroutine of that node's Client waits for the Mutex, takes the other
// nodes at once: it never queues behind a waiter that waits for its owner.
func TestRedLock_ReentryDoesNotQueueBehindItsOwnWaiters(t *testing.T) {
	nodes := redisNodes(t, 3)
	cs := redLockProcess(t, nodes)
	name := lockName(t)
	bg := context.Background()
	held, err := cs[0].Mutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	waiter := lockAsync(cs[0].Mutex(name))
	eventually(t, 2*time.Second, "the waiter subscribed", func() bool {
		ch := "redisson_lock__channel:{" + name + "}"
		return nodes[0].Client().PubSubNumSub(bg, ch).Val()[ch] == 1
	})
	// Another process holds the lock on the other nodes: the RedLock has
	// to wait for one of them.
	others := redLockProcess(t, nodes[1:])
	var blocking []context.Context
	for _, o := range others {
		ctx, err := o.Mutex(name).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		blocking = append(blocking, ctx)
	}
	rl := lock.NewRedLock(name, cs...)
	got := make(chan lockResult, 1)
	go func() {
		ctx, err := rl.TryLock(held, 3*time.Second)
		got <- lockResult{ctx, err}
	}()
	eventually(t, 2*time.Second, "the RedLock waits for an unlock on node 1", func() bool {
		ch := "redisson_lock__channel:{" + name + "}"
		return nodes[1].Client().PubSubNumSub(bg, ch).Val()[ch] == 1
	})
	if err := others[0].Mutex(name).Unlock(blocking[0]); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("a RedLock re-entering a held Mutex: %v", r.err)
	}
	ctx := r.ctx
	if err := rl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	if r := <-waiter; r.err != nil {
		t.Fatal(r.err)
	} else {
		cs[0].Mutex(name).Unlock(r.ctx)
	}
}

// A RedLock that re-enters a node whose lock has vanished, while the other
// nodes are held by someone else, does not try again and again without a
// pause: the node's hold is lost, and so is the context the RedLock was
// asked to re-enter it with.
func TestRedLock_VanishedNodeWhileOthersAreHeldDoesNotSpin(t *testing.T) {
	nodes := redisNodes(t, 3)
	cs := redLockProcess(t, nodes)
	name := lockName(t)
	bg := context.Background()
	held, err := cs[0].Mutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range redLockProcess(t, nodes[1:]) {
		if _, err := o.Mutex(name).Lock(bg); err != nil {
			t.Fatal(err)
		}
	}
	nodes[0].Do("DEL", name) // the re-entered node's lock vanishes
	rdb := nodes[1].Client()
	before := commandCalls(t, rdb)
	_, err = lock.NewRedLock(name, cs...).TryLock(held, 500*time.Millisecond)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("TryLock = %v, want an error matching ErrLost", err)
	}
	if !errors.Is(context.Cause(held), lock.ErrLost) {
		t.Fatalf("the vanished node's hold ended with %v, want ErrLost", context.Cause(held))
	}
	if n := delta(before, commandCalls(t, rdb))["evalsha"]; n > 10 {
		t.Fatalf("%d attempts on a held node within 500ms: the RedLock spins", n)
	}
}

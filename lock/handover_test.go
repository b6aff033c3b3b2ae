package lock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// waiting starts a goroutine that locks m and reports its context, and
// returns once it is queued behind the current holder.
func waiting(t *testing.T, m *lock.Mutex, opts ...lock.LockOption) <-chan context.Context {
	t.Helper()
	got := make(chan context.Context, 1)
	go func() {
		ctx, err := m.Lock(context.Background(), opts...)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- ctx
	}()
	time.Sleep(100 * time.Millisecond) // let it try, subscribe and queue
	return got
}

func TestHandover_WaiterOfTheSameClientGetsTheLockWithoutAnUnlockMessage(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A first handover loads the script.
	got := waiting(t, m)
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	held = <-got
	first, _ := fencing.FromContext(held)
	got = waiting(t, m)

	before := commandCalls(t, rdb)
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	next := <-got
	d := delta(before, commandCalls(t, rdb))
	delete(d, "info")
	// The waiter's field in, the holder's out, and nothing else: the token
	// was reserved at the acquisition, the watchdog's lease goes on.
	if len(d) != 3 || d["evalsha"] != 1 || d["hset"] != 1 || d["hdel"] != 1 {
		t.Fatalf("a handover ran %v; want one script call running HSET and HDEL, no unlock message", d)
	}
	if ttl, _ := m.TTL(context.Background()); ttl < 20*time.Second {
		t.Fatalf("the handed lock's TTL is %v, want the watchdog's lease", ttl)
	}
	tok, _ := fencing.FromContext(next)
	if tok <= first {
		t.Fatalf("token after the handover %d, want above %d", tok, first)
	}
	if !errors.Is(context.Cause(held), lock.ErrReleased) || next.Err() != nil {
		t.Fatal("the releaser's context must end, the new holder's must not")
	}
	if n, _ := m.HoldCount(next); n != 1 {
		t.Fatalf("new holder's count %d", n)
	}
	if err := m.Unlock(next); err != nil {
		t.Fatal(err)
	}
	if locked, _ := m.IsLocked(context.Background()); locked {
		t.Fatal("lock still held after the new holder's unlock")
	}
}

// The holder a lock is handed to runs before its releaser goes on: on one
// hot key the handovers are the critical path, and the releaser's work after
// its Unlock (answering its request, taking the next one) must not delay the
// new holder's. With one P the new holder could otherwise run only once the
// releaser blocked.
func TestHandover_TheNewHolderRunsBeforeItsReleaserGoesOn(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const handovers = 12
	first := 0
	for i := 0; i < handovers; i++ {
		var ran atomic.Bool
		got := make(chan context.Context, 1)
		go func() {
			ctx, err := m.Lock(context.Background())
			if err != nil {
				t.Error(err)
				close(got)
				return
			}
			ran.Store(true)
			got <- ctx
		}()
		time.Sleep(50 * time.Millisecond) // let it try, subscribe and queue
		if err := m.Unlock(held); err != nil {
			t.Fatal(err)
		}
		if ran.Load() {
			first++
		}
		if held = <-got; held == nil {
			t.FailNow()
		}
	}
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	// The scheduler now and then runs the releaser first anyway (it looks
	// at its global queue every 61st time): most of the handovers, not all.
	if first < handovers*3/4 {
		t.Fatalf("the new holder ran before its releaser's Unlock returned in %d of %d handovers, want nearly all", first, handovers)
	}
}

func TestHandover_KeepsTheWaitersFixedLease(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := waiting(t, m, lock.WithLease(300*time.Millisecond))
	handed := time.Now()
	m.Unlock(held)
	next := <-got
	<-next.Done()
	if d := time.Since(handed); d < 250*time.Millisecond || d > 2*time.Second {
		t.Fatalf("the handed lock's lease ended after %v, want its own 300ms", d)
	}
	if !errors.Is(context.Cause(next), lock.ErrLost) {
		t.Fatalf("cause %v", context.Cause(next))
	}
	eventually(t, 2*time.Second, "the key expires with the waiter's lease", func() bool {
		locked, _ := m.IsLocked(context.Background())
		return !locked
	})
}

func TestHandover_FromALostHoldLeavesTheWaiterToTryItself(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := waiting(t, m)
	srv.Do("DEL", lockName(t)) // lost, and the watchdog has not noticed yet
	if err := m.Unlock(held); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("unlock of a lost hold = %v, want ErrLost", err)
	}
	select {
	case next := <-got:
		m.Unlock(next)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was left waiting after a failed handover")
	}
}

func TestHandover_WaitersGivingUpNeverLeaveTheLockStuck(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	var wg sync.WaitGroup
	var got atomic.Int32
	for g := 0; g < 24; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 20; r++ {
				// Short waits and cancellations race with handovers.
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(g%5)*time.Millisecond+time.Millisecond)
				held, err := m.TryLock(ctx, time.Duration(r%3)*time.Millisecond)
				cancel()
				if err != nil {
					continue
				}
				got.Add(1)
				time.Sleep(200 * time.Microsecond)
				if err := m.Unlock(held); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if locked, _ := m.IsLocked(context.Background()); locked {
		t.Fatalf("after %d acquisitions by waiters that often gave up, the lock is still held", got.Load())
	}
	if got.Load() == 0 {
		t.Fatal("nobody ever got the lock")
	}
}

func TestHandover_TurnsRotateBetweenClients(t *testing.T) {
	srv := testenv.Redis(t)
	clients := instances(t, srv, 4)
	// The turns are ordered by pauses of a fraction of a millisecond
	// (turnStagger, yieldDelay), which a loaded machine (CI runs the packages
	// at once, under -race) drowns in scheduling delays; then the order is
	// the race's, with or without the mechanism. So windows are measured
	// until one comes out in rotation, up to eight: one is enough to show
	// the mechanism, since the race alone does not order them. Measured:
	// 93-100% in rotation per window alone and under two CPU hogs; 60% in
	// one window of a CI run with every package testing at once; with the
	// turns left to the race after each unlock message (turnStagger 0),
	// 56-84% per window, with ping-pong turns (two Clients taking turns
	// while the others wait) in every window.
	const windows, want = 8, 88
	var all []map[int]int
	for w := 1; w <= windows; w++ {
		rotated, n, gaps := measureTurns(t, clients, fmt.Sprintf("%s:%d", lockName(t), w))
		all = append(all, gaps)
		if n >= 40 && rotated*100 >= n*want {
			return
		}
		t.Logf("window %d: %d of %d turns in rotation", w, rotated, n)
	}
	t.Fatalf("no window of %d had %d%% of its turns in rotation (turns between two of the same Client, per window: %v)", windows, want, all)
}

// measureTurns has 8 goroutines of each Client lock name for 2 seconds,
// holding it 1 ms each time, and returns how many turns came in rotation
// (between two turns of a Client, each other Client had one), out of how
// many, and the gaps between two turns of a Client, counted in turns.
func measureTurns(t *testing.T, clients []*lock.Client, name string) (rotated, n int, gaps map[int]int) {
	t.Helper()
	var mu sync.Mutex
	counts := make([]int, len(clients))
	var order []int // who held the lock, in the order they held it
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for i, c := range clients {
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex(name)
				for time.Now().Before(stop) {
					ctx, err := m.Lock(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					counts[i]++
					order = append(order, i)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					m.Unlock(ctx)
				}
			}()
		}
	}
	wg.Wait()
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("acquisitions per Client: %v", counts)
	for i, n := range counts {
		if n*10 < total { // each of four should have about a quarter
			t.Fatalf("Client %d got %d of %d acquisitions: starved by the others (%v)", i, n, total, fmt.Sprint(counts))
		}
	}
	// Turns go round: between two turns of a Client, each of the others has
	// one. Left to the race after each unlock message, two Clients could
	// take turns while the others wait.
	gaps = map[int]int{}
	last := map[int]int{}
	turns := 0
	for k, i := range order {
		if k > 0 && order[k-1] == i {
			continue
		}
		if prev, ok := last[i]; ok {
			gaps[turns-prev]++
		}
		last[i] = turns
		turns++
	}
	t.Logf("%d turns; turns between two of the same Client: %v", turns, gaps)
	return gaps[len(clients)], turns - len(clients), gaps
}

func TestHandover_AClientAloneKeepsHandingOver(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	c := instances(t, srv, 1)[0]
	m := c.Mutex(lockName(t))
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, rounds = 8, 10
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, err := m.Lock(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(200 * time.Microsecond)
				m.Unlock(ctx)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond) // all queued behind the holder
	before := commandCalls(t, rdb)
	m.Unlock(held)
	wg.Wait()
	d := delta(before, commandCalls(t, rdb))
	// No other Client listens: turns end only when the queue runs dry, not
	// every cohort of handovers (which would free the lock and publish).
	if d["publish"] > 2 {
		t.Fatalf("%d unlock messages for %d acquisitions by one Client: it freed the lock for nobody (%v)", d["publish"], goroutines*rounds, d)
	}
}

func TestHandover_TokensKeepIncreasingAcrossRunsAndClients(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	m, other := cs[0].Mutex(name), cs[1].Mutex(name)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// More waiters than one acquisition reserves tokens for: the run goes
	// on with tokens the handovers issue.
	const waiters = 30
	var mu sync.Mutex
	var tokens []fencing.Token
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, err := m.Lock(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			tok, _ := fencing.FromContext(ctx)
			mu.Lock()
			tokens = append(tokens, tok)
			mu.Unlock()
			m.Unlock(ctx)
		}()
	}
	time.Sleep(200 * time.Millisecond) // all queued behind the holder
	first, _ := fencing.FromContext(held)
	m.Unlock(held)
	wg.Wait()
	if len(tokens) != waiters {
		t.Fatalf("%d of %d waiters got the lock", len(tokens), waiters)
	}
	prev := first
	for i, tok := range tokens { // in the order they held the lock
		if tok <= prev {
			t.Fatalf("holder %d got token %d after %d: tokens must increase (%v)", i, tok, prev, tokens)
		}
		prev = tok
	}
	// Another Client's acquisition comes after every token the run gave out
	// or reserved.
	ctx, err := other.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := fencing.FromContext(ctx); tok <= prev {
		t.Fatalf("the next Client's token %d is not above the run's last %d", tok, prev)
	}
	other.Unlock(ctx)
}

func TestHandover_AHeadWokenDuringAHandoverNeverReusesAToken(t *testing.T) {
	srv := testenv.Redis(t)
	rdb := srv.Client()
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	bg := context.Background()
	for i := 0; i < 100; i++ {
		held, err := m.Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan context.Context, 1)
		go func() {
			ctx, err := m.Lock(bg)
			if err != nil {
				t.Error(err)
			}
			got <- ctx
		}()
		time.Sleep(5 * time.Millisecond) // queued behind the holder
		// A stray unlock message (a late one, or another process's) sends
		// the waiting head trying while the holder hands the lock to it.
		rdb.Publish(bg, "redisson_lock__channel:{"+name+"}", "0")
		time.Sleep(time.Duration(i%10) * 20 * time.Microsecond)
		first, _ := fencing.FromContext(held)
		if err := m.Unlock(held); err != nil {
			t.Fatal(err)
		}
		next := <-got
		if next == nil {
			t.FailNow()
		}
		if tok, _ := fencing.FromContext(next); tok <= first {
			t.Fatalf("round %d: the next holder's token %d is not above its predecessor's %d", i, tok, first)
		}
		if err := m.Unlock(next); err != nil {
			t.Fatal(err)
		}
	}
}

// A MultiLock or a RedLock that re-enters a held Mutex issues a token above
// the Mutex's and raises its counter; the Mutex's next handover, inside its
// Client, must still hand out a token above that one: every token of a name
// is above every token issued for it before, whichever kind issued it.
func TestHandover_TokenAboveACompoundLocksReentry(t *testing.T) {
	bg := context.Background()
	check := func(t *testing.T, m *lock.Mutex, reenter func(held context.Context) fencing.Token) {
		held, err := m.Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		next := waiting(t, m)
		compound := reenter(held)
		if err := m.Unlock(held); err != nil {
			t.Fatal(err)
		}
		ctx := <-next
		if ctx == nil {
			t.FailNow()
		}
		tok, _ := fencing.FromContext(ctx)
		if tok <= compound {
			t.Fatalf("the Mutex's next holder got token %d, not above the compound lock's %d issued before", tok, compound)
		}
		m.Unlock(ctx)
	}
	t.Run("MultiLock", func(t *testing.T) {
		c := instances(t, testenv.Redis(t), 1)[0]
		name := lockName(t)
		ml := c.MultiLock(name, name+":other")
		check(t, c.Mutex(name), func(held context.Context) fencing.Token {
			ctx, err := ml.Lock(held)
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := fencing.FromContext(ctx)
			if err := ml.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			return tok
		})
	})
	t.Run("RedLock", func(t *testing.T) {
		nodes := redisNodes(t, 3)
		cs := redLockProcess(t, nodes)
		name := lockName(t)
		rl := lock.NewRedLock(name, cs...)
		check(t, cs[0].Mutex(name), func(held context.Context) fencing.Token {
			ctx, err := rl.Lock(held)
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := fencing.FromContext(ctx)
			if err := rl.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			return tok
		})
	})
}

// lateCalls is a go-redis hook that answers the next matching command with
// a read timeout at once and sends it later, on a connection of its own, as
// a request stuck in the network that arrives after its caller gave up.
type lateCalls struct {
	match func(redis.Cmder) bool
	left  atomic.Int32
	delay time.Duration
	via   *redis.Client
	sent  chan struct{}  // when set, closed once the late command has run (one at a time)
	ran   sync.WaitGroup // every late command sent
}

func (h *lateCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.match(cmd) || h.left.Add(-1) < 0 {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		sent := h.sent
		h.ran.Add(1)
		go func() {
			defer h.ran.Done()
			time.Sleep(h.delay)
			h.via.Do(context.Background(), args...)
			if sent != nil {
				close(sent)
			}
		}()
		err := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		cmd.SetErr(err)
		return err
	}
}

// isTransfer matches the handover script: two keys (the lock and its token
// counter), then two owner fields ("<clientUUID>:<ownerID>").
func isTransfer(cmd redis.Cmder) bool {
	args := cmd.Args()
	if cmd.Name() != "evalsha" || len(args) < 7 {
		return false
	}
	k, _ := args[4].(string)
	from, _ := args[5].(string)
	to, _ := args[6].(string)
	return strings.HasPrefix(k, "redisson_lock_token:") && strings.Contains(from, ":") && strings.Contains(to, ":")
}

// A handover whose reply timed out but that reached Redis after the
// releaser gave up on it (and freed the lock) leaves no field behind that
// nobody knows it holds: the waiter gets the lock at once, not when a
// phantom's lease ends.
func TestHandover_TransferAppliedAfterItTimedOutLeavesNoPhantom(t *testing.T) {
	late := &lateCalls{match: isTransfer, delay: 10 * time.Millisecond}
	f := newFaultyHandover(t, late)
	late.via = f.srv.Client()
	ctx := f.handOver(t, func() {
		late.sent = make(chan struct{})
		late.left.Store(1) // the handover times out; its call arrives 10ms later, before the release is retried
	}, func() bool { return late.left.Swap(0) <= 0 })
	<-late.sent
	if ctx.Err() != nil {
		t.Fatalf("the waiter's hold ended: %v", context.Cause(ctx))
	}
	if err := f.m.Unlock(ctx); err != nil {
		t.Fatalf("the waiter's unlock: %v", err)
	}
	f.isFree(t)
}

// A handover sent after its waiter was woken whose call and resent copy
// both time out, and reach Redis later, is undone: the waiter ends up
// holding the lock for real or told it lost it, and nothing is left that
// nobody knows it holds.
func TestHandover_ATransferWhoseResendTimesOutTooLeavesNoPhantom(t *testing.T) {
	late := &lateCalls{match: isTransfer, delay: 10 * time.Millisecond}
	f := newFaultyHandover(t, late)
	late.via = f.srv.Client()
	ctx := f.handOver(t, func() { late.left.Store(2) }, func() bool { return late.left.Swap(0) < 2 })
	late.ran.Wait()
	t.Logf("after the handover, the waiter's context: %v", context.Cause(ctx))
	if ctx.Err() == nil {
		if n, _ := f.srv.Client().HLen(context.Background(), f.name).Result(); n != 1 {
			t.Fatalf("the waiter holds the lock, but its hash has %d fields", n)
		}
		if err := f.m.Unlock(ctx); err != nil {
			t.Fatalf("the waiter's unlock: %v", err)
		}
	} else if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the waiter's hold ended with %v, want ErrLost", cause)
	}
	f.isFree(t)
}

// isAbort matches the call that frees the lock after a handover of unknown
// outcome: the release script of several locks, with the lock and its
// channel twice (the releaser's field and the waiter's).
func isAbort(cmd redis.Cmder) bool {
	args := cmd.Args()
	return cmd.Name() == "evalsha" && len(args) > 2 && args[2] == 4 && isUnlockChannel(args, 4) && isUnlockChannel(args, 6)
}

// isUnlockChannel reports whether args[i] is a Mutex's unlock channel.
func isUnlockChannel(args []any, i int) bool {
	k, _ := args[i].(string)
	return i < len(args) && strings.HasPrefix(k, "redisson_lock__channel:")
}

// A waiter woken late after a handover whose two copies timed out, and
// landed later, tries afresh once the lock was freed: the abort, slow on its
// way, lands before that, and does not remove the waiter's new hold with
// the field the two share.
func TestHandover_ASlowAbortLeavesTheWaitersNewHoldAlone(t *testing.T) {
	late := &lateCalls{match: isTransfer, delay: 10 * time.Millisecond}
	slowAbort := &slowCalls{match: isAbort, delay: 300 * time.Millisecond}
	f := newFaultyHandover(t, late, slowAbort)
	late.via = f.srv.Client()
	defer lock.DelayGrants(func() { time.Sleep(100 * time.Millisecond) })()
	ctx := f.handOver(t, func() {
		late.left.Store(2) // both copies time out, land 10ms later; the abort lands 300ms later
		slowAbort.on.Store(true)
	}, func() bool {
		slowAbort.on.Store(false)
		return late.left.Swap(0) < 2
	})
	late.ran.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the waiter, woken after the failed handover, got a hold that ended: %v", context.Cause(ctx))
	}
	if fields, _ := f.srv.Client().HGetAll(context.Background(), f.name).Result(); len(fields) != 1 {
		t.Fatalf("the waiter holds the lock, but its hash is %v: the abort removed the waiter's new hold", fields)
	}
	if err := f.m.Unlock(ctx); err != nil {
		t.Fatalf("the waiter's unlock: %v", err)
	}
	f.isFree(t)
}

// A handover whose call timed out, and lands later, and whose resent copy
// fails for sure (nothing sent) is aborted all the same: the first copy may
// still land, and left alone it would give the lock to a field nobody
// holds for the rest of its lease.
func TestHandover_AnUnknownTransferWhoseResendFailsIsStillAborted(t *testing.T) {
	late := &lateCalls{match: isTransfer, delay: 20 * time.Millisecond}
	refused := &refusedCalls{match: isTransfer, dial: true}
	f := newFaultyHandover(t, late, refused)
	late.via = f.srv.Client()
	ctx := f.handOver(t, func() {
		late.left.Store(1)
		refused.left.Store(1)
	}, func() bool {
		refused.left.Store(0)
		return late.left.Swap(0) < 1
	})
	late.ran.Wait()
	t.Logf("after the handover, the waiter's context: %v", context.Cause(ctx))
	if ctx.Err() == nil {
		if err := f.m.Unlock(ctx); err != nil {
			t.Fatalf("the waiter's unlock: %v", err)
		}
	}
	f.isFree(t)
}

// faultyHandover is a Client whose go-redis client, retries off, runs hooks
// that make its handovers fail, and a Mutex of it held after a first,
// clean handover (so that Redis knows the transfer script the hooks' late
// calls name). Its lease is the default 30s: a field left behind would hold
// the lock that long.
type faultyHandover struct {
	srv  *testenv.RedisServer
	m    *lock.Mutex
	name string
	held context.Context
}

func newFaultyHandover(t *testing.T, hooks ...redis.Hook) *faultyHandover {
	t.Helper()
	f := &faultyHandover{srv: testenv.Redis(t), name: lockName(t)}
	rdb := f.srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	c := lock.New(rdb)
	t.Cleanup(func() { c.Close() })
	f.m = c.Mutex(f.name)
	held, err := f.m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	next := waiting(t, f.m)
	f.m.Unlock(held)
	if f.held = <-next; f.held == nil {
		t.FailNow()
	}
	return f
}

// handOver unlocks f.held with a waiter queued and returns the waiter's
// hold once the Unlock handed the lock over: arm sets the faults up before
// each Unlock, and handed, called once the waiter has the lock, takes them
// down and reports whether the round handed over. The waiter may still be
// trying when the holder unlocks (a loaded machine): then nothing is handed
// over, and the round is repeated with the waiter's hold.
func (f *faultyHandover) handOver(t *testing.T, arm func(), handed func() bool) context.Context {
	t.Helper()
	for round := 0; round < 5; round++ {
		next := waiting(t, f.m)
		arm()
		f.m.Unlock(f.held)
		var ctx context.Context
		select {
		case ctx = <-next:
			if ctx == nil {
				t.FailNow()
			}
		case <-time.After(3 * time.Second):
			t.Fatal("the waiter did not get the lock within 3s of its release: a faulty handover left a field nobody holds")
		}
		if handed() {
			return ctx
		}
		f.held = ctx
	}
	t.Fatal("no handover in 5 rounds")
	return nil
}

// isFree waits up to a second for the lock to be free.
func (f *faultyHandover) isFree(t *testing.T) {
	t.Helper()
	eventually(t, time.Second, "the lock is free", func() bool { return f.srv.Do("EXISTS", f.name) == int64(0) })
}

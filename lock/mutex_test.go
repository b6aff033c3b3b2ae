package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

func TestMutex_ReentrantHoldNeedsMatchingUnlocks(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	m := cs[0].Mutex(name)
	bg := context.Background()

	ctxA, err := m.Lock(bg) // method A
	if err != nil {
		t.Fatal(err)
	}
	ctxB, err := m.Lock(ctxA) // method B, called by A, locks again
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := m.HoldCount(ctxB); n != 2 {
		t.Fatalf("hold count after A->B = %d, want 2", n)
	}

	acquired := make(chan time.Time, 1)
	go func() {
		ctx, err := cs[1].Mutex(name).Lock(bg)
		if err != nil {
			t.Error(err)
			return
		}
		acquired <- time.Now()
		cs[1].Mutex(name).Unlock(ctx)
	}()

	if err := m.Unlock(ctxB); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.HoldCount(ctxA); n != 1 {
		t.Fatalf("hold count after one unlock = %d, want 1", n)
	}
	if locked, _ := m.IsLocked(bg); !locked {
		t.Fatal("lock free after one of two unlocks")
	}
	select {
	case <-acquired:
		t.Fatal("waiter acquired while one level was still held")
	case <-time.After(200 * time.Millisecond):
	}
	if ctxB.Err() != nil {
		t.Fatalf("releasing the inner level ended the context: %v", context.Cause(ctxB))
	}
	released := time.Now()
	if err := m.Unlock(ctxA); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-acquired:
		if d := at.Sub(released); d > time.Second {
			t.Fatalf("waiter took %v after the final unlock", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by the final unlock")
	}
	if !errors.Is(context.Cause(ctxA), lock.ErrReleased) {
		t.Fatalf("cause after final unlock = %v, want ErrReleased", context.Cause(ctxA))
	}
}

func TestMutex_ReentryAcrossLocksKeepsEachToken(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	x, y := c.Mutex(lockName(t)+":x"), c.Mutex(lockName(t)+":y")
	bg := context.Background()
	cx, err := x.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := fencing.FromContext(cx)
	cy, err := y.Lock(cx) // same owner, another lock
	if err != nil {
		t.Fatal(err)
	}
	ty, _ := fencing.FromContext(cy)
	cx2, err := x.Lock(cy) // re-enter x from y's context
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := fencing.FromContext(cx2); tok != tx {
		t.Fatalf("re-entered token = %d, want x's %d (y's is %d)", tok, tx, ty)
	}
	if n, _ := x.HoldCount(cx2); n != 2 {
		t.Fatalf("x hold count = %d, want 2", n)
	}
	// Releasing x entirely ends every context of x, including the re-entry
	// made from y's context.
	for _, ctx := range []context.Context{cx2, cx} {
		if err := x.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, time.Second, "re-entry context ends with its hold", func() bool { return cx2.Err() != nil })
	if err := y.Unlock(cy); err != nil {
		t.Fatal(err)
	}
}

func TestMutex_UnlockByAnotherContextIsNotHeld(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	ctx, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, other := range []context.Context{context.Background(), ctx} {
		err := cs[1].Mutex(name).Unlock(other) // another Client: never the owner
		if i == 0 {
			err = cs[0].Mutex(name).Unlock(context.Background()) // same Client, no owner
		}
		if !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("unlock %d by a non-owner = %v, want ErrNotHeld", i, err)
		}
	}
	if locked, _ := cs[0].Mutex(name).IsLocked(ctx); !locked {
		t.Fatal("a non-owner's unlock released the lock")
	}
	if err := cs[0].Mutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cs[0].Mutex(name).Unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second unlock = %v, want ErrNotHeld", err)
	}
}

func TestMutex_TryLockGivesUpAfterWait(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Mutex(name).Unlock(held)

	if _, err := cs[1].Mutex(name).TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock(0) = %v, want ErrNotAcquired", err)
	}
	start := time.Now()
	_, err = cs[1].Mutex(name).TryLock(context.Background(), 300*time.Millisecond)
	if !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock(300ms) = %v, want ErrNotAcquired", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Fatalf("TryLock(300ms) gave up after %v", d)
	}
}

func TestMutex_CancelledCallerIsNeverReportedBusy(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Mutex(name).Unlock(held)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = cs[1].Mutex(name).TryLock(ctx, 5*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock with an expiring context = %v, want DeadlineExceeded and not ErrNotAcquired", err)
	}

	cause := errors.New("client went away")
	ctx2, cancel2 := context.WithCancelCause(context.Background())
	go func() { time.Sleep(100 * time.Millisecond); cancel2(cause) }()
	_, err = cs[1].Mutex(name).Lock(ctx2)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("Lock with a cancelled context = %v, want Canceled and the cause", err)
	}

	// A waiter that gave up leaves nothing behind: the next unlock is taken.
	if err := cs[0].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	got, err := cs[1].Mutex(name).TryLock(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cs[1].Mutex(name).Unlock(got)
	held, _ = cs[0].Mutex(name).Lock(context.Background())
}

func TestMutex_WaiterWakesOnUnlockNotAtLeaseExpiry(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2) // default 30s watchdog: expiry would take 30s
	name := lockName(t)
	var worst time.Duration
	for i := 0; i < 5; i++ {
		held, err := cs[0].Mutex(name).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		waiting := make(chan struct{})
		go func() {
			close(waiting)
			ctx, err := cs[1].Mutex(name).Lock(context.Background())
			if err != nil {
				t.Error(err)
				close(got)
				return
			}
			got <- time.Now()
			cs[1].Mutex(name).Unlock(ctx)
		}()
		<-waiting
		time.Sleep(50 * time.Millisecond) // let the waiter subscribe and sleep
		unlocked := time.Now()
		if err := cs[0].Mutex(name).Unlock(held); err != nil {
			t.Fatal(err)
		}
		at, ok := <-got
		if !ok {
			t.FailNow()
		}
		worst = max(worst, at.Sub(unlocked))
	}
	t.Logf("worst wake-up latency after unlock: %v", worst)
	// A wake-up is a pub/sub message: milliseconds. The bound leaves room for
	// a loaded machine and is still far below the 30s lease a missed message
	// would cost.
	if worst > 500*time.Millisecond {
		t.Fatalf("waiter acquired %v after unlock; want well under 500ms (pushed wake-up)", worst)
	}
}

func TestMutex_WaitersOfOneClientAreServedInArrivalOrder(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	held, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, err := m.Lock(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			// Unlock and immediately ask again: must queue behind the others.
			if err := m.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(30 * time.Millisecond) // arrival order i
	}
	if err := m.Unlock(held); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
}

func TestMutex_TokensIncreaseAcrossHoldersAndStayWithinReentry(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 3)
	name := lockName(t)
	var last fencing.Token
	for i := 0; i < 30; i++ {
		m := cs[i%len(cs)].Mutex(name)
		ctx, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok, ok := fencing.FromContext(ctx)
		if !ok || tok <= last {
			t.Fatalf("holder %d token %d (ok=%v) not above previous %d", i, tok, ok, last)
		}
		inner, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if it, _ := fencing.FromContext(inner); it != tok {
			t.Fatalf("re-entry token %d, want %d", it, tok)
		}
		m.Unlock(inner)
		m.Unlock(ctx)
		last = tok
	}
	// Tokens come from the server clock when it is ahead of the counter.
	if now := time.Now().UnixMicro(); int64(last) < now-int64(time.Minute/time.Microsecond) {
		t.Fatalf("token %d is far below the clock %d", last, now)
	}
}

func TestMutex_TokenKeepsIncreasingWhenCounterIsBehindClock(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	// A counter far ahead of the clock (e.g. written by a plain INCR-based
	// fenced lock): the next token is counter+1.
	srv.Do("SET", "redisson_lock_token:{"+name+"}", "9000000000000000")
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := fencing.FromContext(ctx); tok != 9000000000000001 {
		t.Fatalf("token = %d, want 9000000000000001", tok)
	}
	c.Mutex(name).Unlock(ctx)
	// The counter ends at the token or at the last one reserved with it for
	// handovers, written in full.
	v := fmt.Sprint(srv.Do("GET", "redisson_lock_token:{"+name+"}"))
	if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 9000000000000001 || n > 9000000000000001+64 {
		t.Fatalf("stored token %q: must be at the token or just above, written in full, never as %%.14g", v)
	}
}

// A Mutex's acquisition leaves the counter at the last token of its block,
// the one its handovers may give out: acquire.lua has the block's size
// written in, and it must be the one the Go side counts on.
func TestMutex_AcquisitionReservesTheTokenBlock(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Mutex(name).Unlock(ctx)
	tok, _ := fencing.FromContext(ctx)
	v := fmt.Sprint(srv.Do("GET", "redisson_lock_token:{"+name+"}"))
	if n, err := strconv.ParseInt(v, 10, 64); err != nil || fencing.Token(n) != tok+lock.TokenBlock-1 {
		t.Fatalf("token %d, counter %q: want the counter at the block's last token %d", tok, v, tok+lock.TokenBlock-1)
	}
}

func TestMutex_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	cases := map[string]func() error{
		"empty name":            func() error { _, err := c.Mutex("").Lock(bg); return err },
		"unclosed hash tag":     func() error { _, err := c.Mutex("a{b").Lock(bg); return err },
		"empty hash tag":        func() error { _, err := c.Mutex("a{}b").Lock(bg); return err },
		"negative wait":         func() error { _, err := c.Mutex("x").TryLock(bg, -time.Second); return err },
		"zero lease":            func() error { _, err := c.Mutex("x").Lock(bg, lock.WithLease(0)); return err },
		"negative lease":        func() error { _, err := c.Mutex("x").TryLock(bg, 0, lock.WithLease(-time.Second)); return err },
		"sub-millisecond lease": func() error { _, err := c.Mutex("x").Lock(bg, lock.WithLease(time.Microsecond)); return err },
		"nil redis client":      func() error { _, err := lock.New(nil).Mutex("x").Lock(bg); return err },
		"nil lock client":       func() error { var nc *lock.Client; _, err := nc.Mutex("x").Lock(bg); return err },
		"tiny watchdog": func() error {
			_, err := lock.New(srv.Client(), lock.WithWatchdogTimeout(time.Millisecond)).Mutex("x").Lock(bg)
			return err
		},
		"unlock on empty name": func() error { return c.Mutex("").Unlock(bg) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
	if n := srv.Do("DBSIZE"); n != int64(0) {
		t.Fatalf("bad input created %v keys", n)
	}
}

func TestMutex_ClosedClientRefusesAndCancelsHolds(t *testing.T) {
	srv := testenv.Redis(t)
	c := lock.New(srv.Client())
	ctx, err := c.Mutex(lockName(t)).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !errors.Is(context.Cause(ctx), lock.ErrLost) || !errors.Is(context.Cause(ctx), lock.ErrClosed) {
		t.Fatalf("hold cause after Close = %v, want ErrLost and ErrClosed", context.Cause(ctx))
	}
	if _, err := c.Mutex("other").Lock(context.Background()); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("Lock after Close = %v, want ErrClosed", err)
	}
}

func TestMutex_ContextEndingBeforeTheWaitIsNeverBusy(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	held, err := cs[0].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Mutex(name).Unlock(held)
	for i := 0; i < 100; i++ {
		// The context ends first; both may be over by the time the waiter
		// looks (a loaded machine): the answer is the context's.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := cs[1].Mutex(name).TryLock(ctx, 6*time.Millisecond)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("try %d: %v, want the context's DeadlineExceeded, never ErrNotAcquired", i, err)
		}
	}
}

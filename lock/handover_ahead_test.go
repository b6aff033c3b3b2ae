package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// slowCalls is a go-redis hook that holds matching commands back for delay
// before sending them, while on is set: a request slow on its way to Redis.
// With cut set, closing it sends the ones held back at once (the end of a
// test whose calls hang). With bounded set, a call whose context ends while
// it is held back fails with the context's error, unsent, as go-redis's
// calls do with ContextTimeoutEnabled; otherwise the context is ignored, as
// go-redis ignores it by default once the command is written.
type slowCalls struct {
	match   func(redis.Cmder) bool
	delay   time.Duration
	on      atomic.Bool
	cut     chan struct{}
	bounded bool
}

func (h *slowCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *slowCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && h.match(cmd) {
			var ended <-chan struct{}
			if h.bounded {
				ended = ctx.Done()
			}
			t := time.NewTimer(h.delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-h.cut:
			case <-ended:
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// hang makes s's transfers hang until the test ends (or bounded, until
// their context ends): go-redis with ReadTimeout -1 waits for a reply that
// does not come without bound.
func (s *aheadSetup) hang(t *testing.T, bounded bool) {
	t.Helper()
	s.slow.delay = time.Hour
	s.slow.bounded = bounded
	s.slow.cut = make(chan struct{})
	t.Cleanup(func() { close(s.slow.cut) })
}

// aheadSetup is a Client whose handovers reach Redis transferDelay late,
// another Client on the same server, and a Mutex of the first held, with a
// waiter of the same Client queued for it.
type aheadSetup struct {
	srv   *testenv.RedisServer
	slow  *slowCalls
	c     *lock.Client
	other *lock.Client
	m     *lock.Mutex
	held  context.Context
	next  <-chan context.Context
}

const transferDelay = 300 * time.Millisecond

func setupAhead(t *testing.T, opts ...lock.Option) *aheadSetup {
	t.Helper()
	return setupAheadFrom(t, context.Background(), opts...)
}

// setupAheadFrom is setupAhead with the waiter's Lock called with parent.
func setupAheadFrom(t *testing.T, parent context.Context, opts ...lock.Option) *aheadSetup {
	t.Helper()
	s := &aheadSetup{srv: testenv.Redis(t)}
	rdb := s.srv.Client()
	s.slow = &slowCalls{match: isTransfer, delay: transferDelay}
	rdb.AddHook(s.slow)
	s.c = lock.New(rdb, opts...)
	t.Cleanup(func() { s.c.Close() })
	s.other = instances(t, s.srv, 1)[0]
	s.m = s.c.Mutex(lockName(t))
	var err error
	if s.held, err = s.m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	next := make(chan context.Context, 1)
	go func() {
		ctx, err := s.m.Lock(parent)
		if err != nil {
			t.Error(err)
			close(next)
			return
		}
		next <- ctx
	}()
	time.Sleep(100 * time.Millisecond) // let it try, subscribe and queue
	s.next = next
	s.slow.on.Store(true)
	return s
}

// unlockAndTake unlocks s.held in the background and returns the waiter's
// hold, how long after the Unlock began the waiter had it, and the Unlock's
// outcome to come.
func (s *aheadSetup) unlockAndTake(t *testing.T) (context.Context, time.Duration, <-chan error) {
	t.Helper()
	unlocked := make(chan error, 1)
	began := time.Now()
	go func() { unlocked <- s.m.Unlock(s.held) }()
	select {
	case ctx := <-s.next:
		if ctx == nil {
			t.FailNow()
		}
		return ctx, time.Since(began), unlocked
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock")
	}
	return nil, 0, nil
}

// A waiter handed the lock by a holder of its Client runs while the
// transfer is on its way to Redis: on a hot key the round trip is off the
// next holder's path. The lock stays the releaser's in Redis meanwhile, so
// nobody else takes it, and the new holder's Unlock comes after the
// transfer: it frees the lock, rather than finding nothing to release and
// leaving the transferred field behind for a lease.
func TestHandover_TheNewHolderRunsWhileTheTransferIsOnItsWay(t *testing.T) {
	s := setupAhead(t)
	name := lockName(t)
	ctx, took, unlocked := s.unlockAndTake(t)
	if took > transferDelay/2 {
		t.Fatalf("the waiter had the lock %v after the Unlock began, with the transfer %v on its way: it waited for it", took, transferDelay)
	}
	if _, err := s.other.Mutex(name).TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("another Client's TryLock while the transfer is on its way = %v, want ErrNotAcquired", err)
	}
	before, _ := fencing.FromContext(s.held)
	tok, _ := fencing.FromContext(ctx)
	if tok <= before {
		t.Fatalf("the new holder's token %d is not above its releaser's %d", tok, before)
	}
	if err := s.m.Unlock(ctx); err != nil {
		t.Fatalf("the new holder's Unlock: %v", err)
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("the releaser's Unlock: %v", err)
	}
	if n := s.srv.Do("EXISTS", name); n != int64(0) {
		field, _ := s.srv.Client().HGetAll(context.Background(), name).Result()
		t.Fatalf("the lock is still in Redis after the new holder's Unlock (%v, PTTL %v ms): its release overtook the transfer", field, s.srv.Do("PTTL", name))
	}
}

// When the transfer finds that the releaser no longer held the lock (it
// expired, or was force-unlocked) the new holder, running already, is told
// as of any loss: its context ends with ErrLost and its Unlock says so. Its
// token came from the releaser's block, below every token issued after it:
// the writes of whoever takes the lock next refuse its own.
func TestHandover_ANewHolderWhoseTransferFindsTheLockGoneIsTold(t *testing.T) {
	s := setupAhead(t)
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	s.srv.Do("DEL", name) // before the transfer arrives
	theirs, err := s.other.Mutex(name).TryLock(context.Background(), 0)
	if err != nil {
		t.Fatalf("another Client's TryLock of the deleted lock: %v", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(transferDelay + 2*time.Second):
		t.Fatal("the new holder was not told that its handover found the lock gone")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the new holder's cause = %v, want ErrLost", cause)
	}
	if err := s.m.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the new holder's Unlock = %v, want ErrLost", err)
	}
	if err := <-unlocked; !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the releaser's Unlock = %v, want ErrLost", err)
	}
	mine, _ := fencing.FromContext(ctx)
	next, _ := fencing.FromContext(theirs)
	if next <= mine {
		t.Fatalf("the next holder's token %d is not above the lost one's %d", next, mine)
	}
	if owner, _ := s.srv.Client().HGetAll(context.Background(), name).Result(); len(owner) != 1 {
		t.Fatalf("the lock hash %v, want the other Client's field alone", owner)
	}
}

// The watchdog renews the new holder only once the transfer has landed: a
// renewal sent before would find no field of it and drop it, and the lock
// would expire under it. With a lease of 1.2s and the transfer 600ms late,
// a renewal pass falls due while the transfer is on its way.
func TestHandover_TheNewHolderIsRenewedOnlyOnceTheTransferLanded(t *testing.T) {
	const lease = 1200 * time.Millisecond
	s := setupAhead(t, lock.WithWatchdogTimeout(lease))
	s.slow.delay = lease / 2
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	if err := <-unlocked; err != nil {
		t.Fatalf("the releaser's Unlock: %v", err)
	}
	time.Sleep(2 * lease)
	if ctx.Err() != nil {
		t.Fatalf("the new holder's hold ended: %v", context.Cause(ctx))
	}
	field, _ := s.srv.Client().HGetAll(context.Background(), name).Result()
	if len(field) != 1 {
		t.Fatalf("the lock hash %v %v after its lease: want the new holder's field, renewed", field, s.srv.Do("PTTL", name))
	}
	if err := s.m.Unlock(ctx); err != nil {
		t.Fatalf("the new holder's Unlock: %v", err)
	}
}

// A new holder whose transfer hangs on its way is told when its lease ends,
// as a hold cut off from Redis is, not when the call gives up: the lock has
// expired in Redis by then and may be someone else's.
func TestHandover_ANewHolderWhoseTransferHangsIsToldByItsLeaseEnd(t *testing.T) {
	const lease = time.Second
	s := setupAhead(t, lock.WithWatchdogTimeout(lease))
	s.slow.delay = 3 * lease
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	taken := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(lease + lease/2):
		t.Fatalf("the new holder still holds %v after the handover; its lease of %v ended, the transfer hangs for %v", time.Since(taken), lease, s.slow.delay)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the new holder's cause = %v, want ErrLost", cause)
	}
	theirs, err := s.other.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatalf("another Client's Lock after the lease: %v", err)
	}
	if err := s.m.Unlock(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the new holder's Unlock = %v, want ErrLost", err)
	}
	<-unlocked
	if err := s.other.Mutex(name).Unlock(theirs); err != nil {
		t.Fatalf("the other Client's Unlock after the late transfer: %v", err)
	}
}

// A compound lock that re-enters a hold handed over ahead of its transfer
// gets it once the transfer has landed (its hold waits for the transfer,
// and, were it sent first, its script would find the lock still the
// releaser's and wait for it), and the new holder's Unlock then frees the
// lock.
func TestHandover_AMultiLockReenteringANewHolderWaitsForItsTransfer(t *testing.T) {
	s := setupAhead(t)
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	ml := s.c.MultiLock(name, name+":other")
	both, err := ml.Lock(ctx)
	if err != nil {
		t.Fatalf("the MultiLock re-entering the new holder's lock: %v", err)
	}
	if err := ml.Unlock(both); err != nil {
		t.Fatalf("the MultiLock's Unlock: %v", err)
	}
	if err := s.m.Unlock(ctx); err != nil {
		t.Fatalf("the new holder's Unlock: %v", err)
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("the releaser's Unlock: %v", err)
	}
	eventually(t, time.Second, "the lock is free", func() bool { return s.srv.Do("EXISTS", name) == int64(0) })
}

// A new holder whose context ends while its transfer is on its way is
// released as its Unlock would be, after the transfer: the lock is free
// then, not held by a field that landed after its release.
func TestHandover_ANewHolderWhoseContextEndsBeforeItsTransferLandsFreesTheLock(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := setupAheadFrom(t, parent)
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	cancel()
	<-ctx.Done()
	if err := <-unlocked; err != nil {
		t.Fatalf("the releaser's Unlock: %v", err)
	}
	eventually(t, 2*time.Second, "the lock is free after the new holder's context ended", func() bool {
		return s.srv.Do("EXISTS", name) == int64(0)
	})
	if _, err := s.other.Mutex(name).TryLock(context.Background(), 0); err != nil {
		t.Fatalf("another Client's TryLock after the new holder's context ended: %v", err)
	}
}

// A new holder whose transfer lands late, but within its lease, is renewed
// from its landing on: the renewal passes that ran while the transfer was
// on its way passed it over, and the next one comes after its lease. Here
// the releaser unlocks late in a renewal period (0.8 of a period after the
// watchdog renewed it) and its transfer takes half a lease to land, after
// the last pass of the releaser's lease: a watchdog timeout of 10 s, and a
// transfer whose resend follows a read timeout of 3 s.
func TestHandover_ANewHolderWhoseTransferLandsLateIsRenewedOnLanding(t *testing.T) {
	const lease = 2400 * time.Millisecond
	period := lease / 3
	renewed := make(chan struct{}, 1)
	s := setupAhead(t, lock.WithWatchdogTimeout(lease), lock.WithObserver(func(e lock.Event) {
		if e.Type == lock.EventRenewed {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}))
	s.slow.delay = lease / 2
	name := lockName(t)
	select {
	case <-renewed: // one from before, maybe
	default:
	}
	select {
	case <-renewed:
	case <-time.After(2 * period):
		t.Fatal("the releaser was not renewed")
	}
	time.Sleep(period * 4 / 5)
	ctx, _, unlocked := s.unlockAndTake(t)
	taken := time.Now()
	if err := <-unlocked; err != nil {
		t.Fatalf("the releaser's Unlock: %v", err)
	}
	time.Sleep(time.Until(taken.Add(2 * lease)))
	if ctx.Err() != nil {
		t.Fatalf("the new holder's hold, its transfer landed %v after the handover, ended within two leases of it: %v",
			s.slow.delay, context.Cause(ctx))
	}
	if field, _ := s.srv.Client().HGetAll(context.Background(), name).Result(); len(field) != 1 {
		t.Fatalf("the lock hash %v (PTTL %v ms) two leases after the handover: want the new holder's field, renewed", field, s.srv.Do("PTTL", name))
	}
	if err := s.m.Unlock(ctx); err != nil {
		t.Fatalf("the new holder's Unlock: %v", err)
	}
}

// A new holder whose transfer hangs (go-redis waits for a reply without
// bound with ReadTimeout -1) is told at its lease end that it lost the lock,
// and from then on its hold answers every call at once: the Unlock,
// HoldCount and MultiLock re-entry it made while the transfer was on its
// way return then, and so does an Unlock after its parent's end began its
// release, rather than wait for the transfer call for as long as go-redis
// does.
func TestHandover_ANewHolderLostWhileItsTransferHangsAnswersAtOnce(t *testing.T) {
	const lease = time.Second
	late := lease / 2 // after the lease end, the longest an answer may take
	t.Run("Unlock and HoldCount", func(t *testing.T) {
		s := setupAhead(t, lock.WithWatchdogTimeout(lease))
		s.hang(t, false)
		name := lockName(t)
		ctx, _, _ := s.unlockAndTake(t)
		taken := time.Now()
		relocked := make(chan error, 1)
		go func() {
			_, err := s.c.MultiLock(name, name+":other").Lock(context.WithoutCancel(ctx))
			relocked <- err
		}()
		unlocked := make(chan error, 1)
		go func() { unlocked <- s.m.Unlock(ctx) }()
		counted := make(chan error, 1)
		go func() {
			// Asked with a context that carries the hold but does not end
			// with it (a job's, say): only the hold's loss stops the wait.
			n, err := s.m.HoldCount(context.WithoutCancel(ctx))
			if err == nil && n != 0 {
				err = fmt.Errorf("count %d", n)
			}
			counted <- err
		}()
		select {
		case err := <-unlocked:
			if !errors.Is(err, lock.ErrLost) {
				t.Errorf("the new holder's Unlock = %v, want ErrLost", err)
			}
		case <-time.After(time.Until(taken.Add(lease + late))):
			t.Errorf("the new holder's Unlock still waits %v after the handover, its lease of %v over (its context: %v)",
				time.Since(taken), lease, context.Cause(ctx))
		}
		select {
		case err := <-counted:
			if err != nil {
				t.Errorf("the lost holder's HoldCount: %v, want 0", err)
			}
		case <-time.After(time.Until(taken.Add(lease + late))):
			t.Errorf("the new holder's HoldCount still waits %v after the handover, its lease of %v over", time.Since(taken), lease)
		}
		select {
		case err := <-relocked:
			if !errors.Is(err, lock.ErrLost) {
				t.Errorf("a MultiLock re-entering the lost hold = %v, want ErrLost", err)
			}
		case <-time.After(time.Until(taken.Add(lease + late))):
			t.Errorf("a MultiLock re-entering the new holder's hold still waits %v after the handover, its lease of %v over", time.Since(taken), lease)
		}
		go func() { unlocked <- s.m.Unlock(ctx) }()
		select {
		case err := <-unlocked:
			if !errors.Is(err, lock.ErrLost) {
				t.Errorf("the lost holder's Unlock again = %v, want ErrLost", err)
			}
		case <-time.After(late):
			t.Errorf("the lost holder's Unlock again still waits after %v", late)
		}
	})
	t.Run("after its parent's end", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := setupAheadFrom(t, parent, lock.WithWatchdogTimeout(lease))
		s.hang(t, false)
		ctx, _, _ := s.unlockAndTake(t)
		taken := time.Now()
		cancel() // its release waits for the transfer
		unlocked := make(chan error, 1)
		go func() { unlocked <- s.m.Unlock(ctx) }()
		select {
		case err := <-unlocked:
			if err != nil && !errors.Is(err, lock.ErrLost) {
				t.Fatalf("the new holder's Unlock after its parent's end = %v, want nil or ErrLost", err)
			}
		case <-time.After(lease + late):
			t.Fatalf("the new holder's Unlock after its parent's end still waits %v after the handover, its lease of %v over", time.Since(taken), lease)
		}
	})
}

// The releaser's context ends, with ErrReleased, before the holder it hands
// the lock to runs: two contexts of one lock are never live at once. A
// handover ahead ends it before its waiter is woken, while the transfer is
// still on its way; an ordinary one (the waiter's lease is fixed) before the
// waiter is woken too, however long the releaser then takes to settle its
// release (an Observer slow to take the releaser's end stands for a
// releaser the scheduler leaves waiting).
func TestHandover_TheReleasersContextEndsBeforeTheNextHolderRuns(t *testing.T) {
	check := func(t *testing.T, held, next context.Context) {
		t.Helper()
		if held.Err() == nil {
			t.Fatal("the releaser's context is live while the new holder runs")
		}
		if cause := context.Cause(held); !errors.Is(cause, lock.ErrReleased) {
			t.Fatalf("the releaser's context ended with %v, want ErrReleased", cause)
		}
		if next.Err() != nil {
			t.Fatalf("the new holder's context ended: %v", context.Cause(next))
		}
	}
	t.Run("ahead of its transfer", func(t *testing.T) {
		s := setupAhead(t)
		ctx, _, unlocked := s.unlockAndTake(t)
		check(t, s.held, ctx)
		if err := s.m.Unlock(ctx); err != nil {
			t.Fatalf("the new holder's Unlock: %v", err)
		}
		if err := <-unlocked; err != nil {
			t.Fatalf("the releaser's Unlock: %v", err)
		}
	})
	t.Run("after its transfer", func(t *testing.T) {
		var stall atomic.Bool
		srv := testenv.Redis(t)
		c := instances(t, srv, 1, lock.WithObserver(func(e lock.Event) {
			if e.Type == lock.EventReleased && stall.CompareAndSwap(true, false) {
				time.Sleep(300 * time.Millisecond)
			}
		}))[0]
		m := c.Mutex(lockName(t))
		held, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		next := waiting(t, m, lock.WithLease(10*time.Second))
		stall.Store(true)
		unlocked := make(chan error, 1)
		go func() { unlocked <- m.Unlock(held) }()
		ctx := <-next
		if ctx == nil {
			t.FailNow()
		}
		check(t, held, ctx)
		if err := <-unlocked; err != nil {
			t.Fatalf("the releaser's Unlock: %v", err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("the new holder's Unlock: %v", err)
		}
	})
}

// A transfer whose call hangs ends with the new holder's lease, when the
// lock has expired and the new holder was told it lost it: for a go-redis
// client that heeds a call's context while it waits for the reply
// (ContextTimeoutEnabled), the releaser's Unlock returns then, the lock
// freed, rather than wait for the reply for as long as go-redis does.
func TestHandover_ATransferThatHangsEndsWithTheNewHoldersLease(t *testing.T) {
	const lease = time.Second
	s := setupAhead(t, lock.WithWatchdogTimeout(lease))
	s.hang(t, true)
	name := lockName(t)
	ctx, _, unlocked := s.unlockAndTake(t)
	taken := time.Now()
	select {
	case err := <-unlocked:
		if err != nil {
			t.Fatalf("the releaser's Unlock: %v, want nil (the lock freed)", err)
		}
	case <-time.After(lease + lease/2):
		t.Fatalf("the releaser's Unlock still waits for the transfer %v after the handover, the new holder's lease of %v over", time.Since(taken), lease)
	}
	if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("the new holder's cause = %v, want ErrLost", cause)
	}
	if _, err := s.other.Mutex(name).TryLock(context.Background(), time.Second); err != nil {
		t.Fatalf("another Client's TryLock after the transfer ended: %v", err)
	}
}

// A handover ahead whose transfer and its resend fail with an unknown
// outcome, and whose abort fails too, leaves the releaser's release to the
// retries in the background, as any final Unlock that failed: its context
// ended as the waiter was woken, the retries free the lock, and the caller's
// own retry of its Unlock, after them, returns nil.
func TestHandover_AReleaseWhoseTransferAheadFailedIsRetriedInTheBackground(t *testing.T) {
	refused := &refusedCalls{match: isTransfer}
	abort := &refusedCalls{match: isAbort}
	f := newFaultyHandover(t, refused, abort)
	ctx := f.handOver(t, func() {
		refused.left.Store(2)
		abort.left.Store(1)
	}, func() bool {
		defer abort.left.Store(0)
		return refused.left.Swap(0) < 2
	})
	releaser := f.held
	if cause := context.Cause(releaser); !errors.Is(cause, lock.ErrReleased) {
		t.Fatalf("the releaser's context: %v, want ended with ErrReleased", cause)
	}
	// The waiter was told it lost the lock, or tried afresh once it was
	// freed: either way the releaser's field goes.
	eventually(t, 3*time.Second, "the releaser's field gone", func() bool {
		n, _ := f.srv.Client().HLen(context.Background(), f.name).Result()
		return ctx.Err() != nil && n == 0 || ctx.Err() == nil && n == 1
	})
	if err := f.m.Unlock(releaser); err != nil {
		t.Fatalf("the caller's retry of the releaser's Unlock after the background retry released it: %v, want nil", err)
	}
	if ctx.Err() == nil {
		if err := f.m.Unlock(ctx); err != nil {
			t.Fatalf("the waiter's Unlock: %v", err)
		}
	}
	f.isFree(t)
}

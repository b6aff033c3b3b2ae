package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// The contract every kind of lock keeps, written once and run for each
// kind: Mutex, FairMutex, both sides of an RWMutex, a Semaphore of one
// permit, MultiLock and RedLock. The kinds' own files test what differs
// between them (fair order, writer preference, permits, quorum).

// A locker is one side of a kind's lock as one process sees it.
type locker struct {
	lock   func(ctx context.Context, opts ...lock.LockOption) (context.Context, error)
	try    func(ctx context.Context, wait time.Duration, opts ...lock.LockOption) (context.Context, error)
	unlock func(ctx context.Context) error
}

// A process is what one process of a service has: a lock Client per Redis
// node (one node but for a RedLock).
type process []*lock.Client

// A kindCase is one kind of lock under the contract.
type kindCase struct {
	name   string
	nodes  int  // redis-servers
	shared bool // holders of its own side may overlap (a read lock)
	tokens bool // its holds carry fencing tokens
	// on returns the lock called name as process p sees it: its own side
	// and the side it excludes (itself, or the write side of a read lock).
	on func(p process, name string) (own, against locker)
	// keys returns the Redis keys of the lock called name that deleting
	// loses every hold of it (on every node).
	keys func(name string) []string
	// gone returns the keys that must not be left once every holder of
	// the lock called name released it.
	gone func(name string) []string
}

func mutexLocker(m *lock.Mutex) locker     { return locker{m.Lock, m.TryLock, m.Unlock} }
func fairLocker(m *lock.FairMutex) locker  { return locker{m.Lock, m.TryLock, m.Unlock} }
func multiLocker(m *lock.MultiLock) locker { return locker{m.Lock, m.TryLock, m.Unlock} }
func redLocker(m *lock.RedLock) locker     { return locker{m.Lock, m.TryLock, m.Unlock} }

var contractKinds = []kindCase{
	{name: "Mutex", nodes: 1, tokens: true,
		on: func(p process, n string) (locker, locker) {
			l := mutexLocker(p[0].Mutex(n))
			return l, l
		},
		keys: func(n string) []string { return []string{n} },
		gone: func(n string) []string { return []string{n} },
	},
	{name: "FairMutex", nodes: 1, tokens: true,
		on: func(p process, n string) (locker, locker) {
			l := fairLocker(p[0].FairMutex(n))
			return l, l
		},
		keys: func(n string) []string { return []string{n} },
		gone: func(n string) []string { q, tm := fairKeys(n); return []string{n, q, tm} },
	},
	{name: "RWMutexWrite", nodes: 1, tokens: true,
		on: func(p process, n string) (locker, locker) {
			rw := p[0].RWMutex(n)
			l := locker{rw.Lock, rw.TryLock, rw.Unlock}
			return l, l
		},
		keys: func(n string) []string { return []string{n} },
		gone: func(n string) []string { return []string{n} },
	},
	{name: "RWMutexRead", nodes: 1, shared: true,
		on: func(p process, n string) (locker, locker) {
			rw := p[0].RWMutex(n)
			return locker{rw.RLock, rw.TryRLock, rw.RUnlock}, locker{rw.Lock, rw.TryLock, rw.Unlock}
		},
		keys: func(n string) []string { return []string{n} },
		gone: func(n string) []string { return []string{n} },
	},
	{name: "Semaphore1", nodes: 1,
		on: func(p process, n string) (locker, locker) {
			s := p[0].Semaphore(n, 1)
			l := locker{s.Acquire, s.TryAcquire, s.Release}
			return l, l
		},
		// The count of free permits stays, with an idle expiry (see
		// TestSemaphore_ACountOfOursExpiresWhenIdle); the permits go.
		keys: func(n string) []string { return []string{n, permitsKey(n)} },
		gone: func(n string) []string { return []string{permitsKey(n)} },
	},
	{name: "MultiLock", nodes: 1, tokens: true,
		on: func(p process, n string) (locker, locker) {
			l := multiLocker(p[0].MultiLock(n+":a", n+":b"))
			return l, l
		},
		keys: func(n string) []string { return []string{n + ":a", n + ":b"} },
		gone: func(n string) []string { return []string{n + ":a", n + ":b"} },
	},
	{name: "RedLock", nodes: 3, tokens: true,
		on: func(p process, n string) (locker, locker) {
			l := redLocker(lock.NewRedLock(n, p...))
			return l, l
		},
		keys: func(n string) []string { return []string{n} },
		gone: func(n string) []string { return []string{n} },
	},
}

// contractEnv is one kind's servers and the processes a contract runs.
type contractEnv struct {
	k    kindCase
	srvs []*testenv.RedisServer
	lose *lostReplies // on every process's go-redis clients: loses the replies it is armed for
	name string
}

// processes returns n processes on the env's servers, closed when t ends.
func (e *contractEnv) processes(t *testing.T, n int, opts ...lock.Option) []process {
	t.Helper()
	out := make([]process, n)
	for i := range out {
		for _, s := range e.srvs {
			rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 300 * time.Millisecond })
			rdb.AddHook(e.lose)
			c := lock.New(rdb, opts...)
			t.Cleanup(func() { c.Close(); rdb.Close() })
			out[i] = append(out[i], c)
		}
	}
	return out
}

// delete removes the lock's keys on every node behind its holders' back.
func (e *contractEnv) delete() {
	for _, s := range e.srvs {
		for _, k := range e.k.keys(e.name) {
			s.Do("DEL", k)
		}
	}
}

// freed reports whether none of the keys of a released lock is left.
func (e *contractEnv) freed(t *testing.T) {
	t.Helper()
	for i, s := range e.srvs {
		for _, k := range e.k.gone(e.name) {
			if v := s.Do("EXISTS", k); v != int64(0) {
				t.Errorf("node %d: %s left behind after every holder released", i, k)
			}
		}
	}
}

// The contracts, each run for every kind it applies to.
var contracts = []struct {
	name    string
	run     func(t *testing.T, e *contractEnv)
	applies func(k kindCase) bool // the kinds it applies to; nil: every kind
}{
	{name: "ExcludesAcrossClients", run: contractExcludes},
	{name: "ReentryCountsLevels", run: contractReentryCounts},
	{name: "HoldEndsWithItsContext", run: contractEndsWithContext},
	{name: "ForeignContextIsNotHeld", run: contractForeignNotHeld},
	{name: "LossEndsWithErrLost", run: contractLossIsErrLost},
	{name: "UnlockIsRetrySafe", run: contractRetrySafeUnlock},
	{name: "TokensIncreaseAcrossHolders", run: contractTokenOrder, applies: func(k kindCase) bool { return k.tokens }},
	{name: "RenewalExtendsOnlyAHeldLock", run: contractRenewsOnlyHeld},
	{name: "ReentryNeverWeakensTheHold", run: contractReentryNeverWeakens},
}

func TestContract(t *testing.T) {
	for _, k := range contractKinds {
		t.Run(k.name, func(t *testing.T) {
			srvs := make([]*testenv.RedisServer, k.nodes)
			for i := range srvs {
				srvs[i] = testenv.Redis(t)
			}
			for _, c := range contracts {
				if c.applies != nil && !c.applies(k) {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					e := &contractEnv{k: k, srvs: srvs, lose: &lostReplies{}, name: lockName(t)}
					e.lose.match = scriptWithKeyPrefix(e.name)
					c.run(t, e)
				})
			}
		})
	}
}

// scriptWithKeyPrefix matches script calls with a key that contains name.
func scriptWithKeyPrefix(name string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		if cmd.Name() != "evalsha" && cmd.Name() != "eval" {
			return false
		}
		for _, a := range cmd.Args()[3:] {
			if s, ok := a.(string); ok && strings.Contains(s, name) {
				return true
			}
		}
		return false
	}
}

// Three Clients times four goroutines: no two exclusive holds overlap, and
// a shared hold never overlaps an exclusive one.
func contractExcludes(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 3)
	const goroutines, rounds = 4, 4
	var mu sync.Mutex
	var shared, exclusive, overlaps, counter int
	enter := func(excl bool) {
		mu.Lock()
		defer mu.Unlock()
		if exclusive > 0 || excl && shared > 0 {
			overlaps++
		}
		if excl {
			exclusive++
		} else {
			shared++
		}
	}
	leave := func(excl bool) {
		mu.Lock()
		defer mu.Unlock()
		if excl {
			exclusive--
		} else {
			shared--
		}
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		own, against := e.k.on(p, e.name)
		for g := range goroutines {
			l, excl := own, !e.k.shared
			if g%2 == 1 {
				l, excl = against, true
			}
			wg.Go(func() {
				for range rounds {
					ctx, err := l.lock(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					enter(excl)
					if excl {
						v := counter
						time.Sleep(100 * time.Microsecond)
						counter = v + 1
					} else {
						time.Sleep(100 * time.Microsecond)
					}
					leave(excl)
					if err := l.unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if overlaps != 0 {
		t.Fatalf("%d holds overlapped an exclusive hold", overlaps)
	}
	if want := len(ps) * goroutines * rounds; !e.k.shared && counter != want {
		t.Fatalf("counter = %d, want %d: updates were lost", counter, want)
	}
	e.freed(t)
}

// Each Lock of a held lock through its context adds a level, each Unlock
// removes one, and only the last frees the lock: the count Redis stores
// decides when the owner is removed.
func contractReentryCounts(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 2)
	own, _ := e.k.on(ps[0], e.name)
	_, other := e.k.on(ps[1], e.name)
	ctxs := make([]context.Context, 3)
	ctx := context.Background()
	for i := range ctxs {
		var err error
		if ctx, err = own.lock(ctx); err != nil {
			t.Fatalf("level %d: %v", i+1, err)
		}
		ctxs[i] = ctx
	}
	for i := len(ctxs) - 1; i >= 0; i-- {
		if _, err := other.try(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("another Client while %d levels are held: %v, want ErrNotAcquired", i+1, err)
		}
		if err := own.unlock(ctxs[i]); err != nil {
			t.Fatalf("unlock of level %d: %v", i+1, err)
		}
	}
	got, err := other.try(context.Background(), 0)
	if err != nil {
		t.Fatalf("another Client after every level was released: %v", err)
	}
	if err := other.unlock(got); err != nil {
		t.Fatal(err)
	}
	if err := own.unlock(ctxs[0]); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("one unlock too many: %v, want ErrNotHeld", err)
	}
	e.freed(t)
}

// A hold taken with a context that ends is released with it: its own
// context ends with the caller's cause, and another Client gets the lock.
func contractEndsWithContext(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 2)
	own, _ := e.k.on(ps[0], e.name)
	_, other := e.k.on(ps[1], e.name)
	parent, cancel := context.WithCancelCause(context.Background())
	held, err := own.lock(parent)
	if err != nil {
		t.Fatal(err)
	}
	why := errors.New("the request ended")
	cancel(why)
	select {
	case <-held.Done():
	case <-time.After(time.Second):
		t.Fatal("the hold outlived the context it was taken with")
	}
	if !errors.Is(context.Cause(held), why) {
		t.Errorf("cause = %v, want the parent's", context.Cause(held))
	}
	got, err := other.try(context.Background(), 2*time.Second)
	if err != nil {
		t.Fatalf("another Client after the holder's context ended: %v", err)
	}
	if err := other.unlock(got); err != nil {
		t.Fatal(err)
	}
	if err := own.unlock(held); err != nil {
		t.Errorf("Unlock after the context ended = %v, want nil", err)
	}
	e.freed(t)
}

// Unlock with a context that does not hold the lock is ErrNotHeld and
// leaves the hold alone.
func contractForeignNotHeld(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 2)
	own, _ := e.k.on(ps[0], e.name)
	_, other := e.k.on(ps[1], e.name)
	held, err := own.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unrelated, _ := e.k.on(ps[0], e.name+":other")
	uctx, err := unrelated.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for what, ctx := range map[string]context.Context{"context.Background()": context.Background(), "a hold of another lock": uctx} {
		if err := own.unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("Unlock with %s = %v, want ErrNotHeld", what, err)
		}
		if err := other.unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("another Client's Unlock with %s = %v, want ErrNotHeld", what, err)
		}
	}
	if _, err := other.try(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("after foreign unlocks: %v, want the lock still held", err)
	}
	if held.Err() != nil {
		t.Fatalf("the hold ended: %v", context.Cause(held))
	}
	if err := own.unlock(held); err != nil {
		t.Fatal(err)
	}
	if err := unrelated.unlock(uctx); err != nil {
		t.Fatal(err)
	}
}

// A hold found gone (its keys deleted) ends with a cause matching ErrLost,
// and its Unlock says so.
func contractLossIsErrLost(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 1, lock.WithWatchdogTimeout(900*time.Millisecond))
	own, _ := e.k.on(ps[0], e.name)
	held, err := own.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.delete()
	select {
	case <-held.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the hold was not found lost")
	}
	if !errors.Is(context.Cause(held), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(held))
	}
	if err := own.unlock(held); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Unlock of a lost hold = %v, want ErrLost", err)
	}
}

// An Unlock whose reply was lost (it was applied) and that is called again
// releases one level, not two.
func contractRetrySafeUnlock(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 2)
	own, _ := e.k.on(ps[0], e.name)
	_, other := e.k.on(ps[1], e.name)
	outer, err := own.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	inner, err := own.lock(outer)
	if err != nil {
		t.Fatal(err)
	}
	// unlock releases ctx's level with the replies of its script calls
	// lost, then calls Unlock again if it failed, as a caller retrying
	// would.
	unlock := func(what string, ctx context.Context) {
		t.Helper()
		e.lose.left.Store(int32(len(e.srvs)))
		first := own.unlock(ctx)
		e.lose.left.Store(0)
		if first == nil {
			return
		}
		if err := own.unlock(ctx); err != nil {
			t.Fatalf("the retry of the %s Unlock = %v (the first: %v)", what, err, first)
		}
	}
	unlock("inner", inner)
	if _, err := other.try(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("after an Unlock and its retry of the inner level: %v, want the outer level still held", err)
	}
	if outer.Err() != nil {
		t.Fatalf("the outer level ended: %v", context.Cause(outer))
	}
	unlock("final", outer)
	got, err := other.try(context.Background(), time.Second)
	if err != nil {
		t.Fatalf("after the last level and its retry: %v", err)
	}
	if err := other.unlock(got); err != nil {
		t.Fatal(err)
	}
}

// Every acquisition, from any Client, carries a token above every earlier
// holder's; a re-entry keeps its hold's token.
func contractTokenOrder(t *testing.T, e *contractEnv) {
	ps := e.processes(t, 3)
	var last fencing.Token
	for i := range 9 {
		l, _ := e.k.on(ps[i%len(ps)], e.name)
		held, err := l.lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok, ok := fencing.FromContext(held)
		if !ok || tok <= last {
			t.Fatalf("acquisition %d: token %d (%v), want above %d", i, tok, ok, last)
		}
		again, err := l.lock(held)
		if err != nil {
			t.Fatal(err)
		}
		if re, _ := fencing.FromContext(again); re != tok {
			t.Fatalf("re-entry token %d, want its hold's %d", re, tok)
		}
		last = tok
		if err := l.unlock(again); err != nil {
			t.Fatal(err)
		}
		if err := l.unlock(held); err != nil {
			t.Fatal(err)
		}
	}
}

// A renewal extends only a lock its owner still holds: once the hold is
// lost and another owner took the lock with a short fixed lease, the lost
// holder's renewals neither keep it alive nor report it held.
func contractRenewsOnlyHeld(t *testing.T, e *contractEnv) {
	const watchdog = 900 * time.Millisecond
	ps := e.processes(t, 3, lock.WithWatchdogTimeout(watchdog))
	own, _ := e.k.on(ps[0], e.name)
	next, _ := e.k.on(ps[1], e.name)
	_, last := e.k.on(ps[2], e.name)
	held, err := own.lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	e.delete()
	// Twice the lost holder's renewal period: its first renewal after the
	// loss finds the other owner's lock still there (a shorter lease could
	// end before that renewal, which would then find nothing to stretch).
	const lease = 2 * watchdog / 3
	taken, err := next.try(context.Background(), time.Second, lock.WithLease(lease))
	if err != nil {
		t.Fatalf("another owner after the loss: %v", err)
	}
	took := time.Now()
	select {
	case <-held.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the lost holder was not told")
	}
	if !errors.Is(context.Cause(held), lock.ErrLost) {
		t.Fatalf("cause = %v, want ErrLost", context.Cause(held))
	}
	// Past the fixed lease and several renewal periods of the lost holder:
	// the lock is free, nothing stretched it.
	time.Sleep(time.Until(took.Add(lease + watchdog)))
	if taken.Err() == nil {
		t.Errorf("the fixed lease of %v did not end", lease)
	}
	got, err := last.try(context.Background(), 0)
	if err != nil {
		t.Fatalf("%v after a %v fixed lease began: %v (the lease was stretched)", time.Since(took), lease, err)
	}
	if err := last.unlock(got); err != nil {
		t.Fatal(err)
	}
}

// A re-entry never weakens the hold it enters. One WithLease shorter than
// what is left of a fixed hold's lease leaves its deadline: another Client
// stays out until the original lease ends. One WithLease of a hold the
// watchdog renews leaves it renewed past that lease.
func contractReentryNeverWeakens(t *testing.T, e *contractEnv) {
	stillHeld := func(other locker, what string, held ...context.Context) {
		t.Helper()
		for i, ctx := range held {
			if ctx.Err() != nil {
				t.Fatalf("%s: context %d ended: %v", what, i, context.Cause(ctx))
			}
		}
		if got, err := other.try(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
			if err == nil {
				_ = other.unlock(got)
			}
			t.Fatalf("%s: another Client's attempt = %v, want ErrNotAcquired", what, err)
		}
	}
	reenter := func(ps []process, opts ...lock.LockOption) (own locker, outer, inner context.Context) {
		t.Helper()
		own, _ = e.k.on(ps[0], e.name)
		outer, err := own.lock(context.Background(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if inner, err = own.lock(outer, lock.WithLease(100*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		return own, outer, inner
	}
	release := func(own locker, ctxs ...context.Context) {
		t.Helper()
		for _, ctx := range ctxs {
			if err := own.unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	ps := e.processes(t, 2)
	_, other := e.k.on(ps[1], e.name)
	own, outer, inner := reenter(ps, lock.WithLease(1500*time.Millisecond))
	time.Sleep(500 * time.Millisecond) // well past the re-entry's lease
	stillHeld(other, "a fixed hold past a shorter re-entry's lease", outer, inner)
	release(own, inner, outer)

	const watchdog = 600 * time.Millisecond // renewals every 200ms
	ps = e.processes(t, 2, lock.WithWatchdogTimeout(watchdog))
	_, other = e.k.on(ps[1], e.name)
	own, outer, inner = reenter(ps)
	time.Sleep(2 * watchdog) // past the re-entry's lease and a watchdog timeout
	stillHeld(other, "a watchdog hold re-entered WithLease, two watchdog timeouts later", outer, inner)
	release(own, inner, outer)
	e.freed(t)
}

package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// foreignLook is how long a waiter that finds the lock free with a foreign
// waiter first in line waits before it looks again: a live one takes the lock
// within a round trip, so one still first then is taken to be stuck, which
// the Client logs (see fairWaiter.stuck).
const foreignLook = time.Second

// A FairMutex is a Mutex granted in arrival order across every Client and
// every Redisson RFairLock of its name: first come, first served. Its holds
// are the Mutex's (the same hash, tokens and re-entry through the context; a
// Mutex and a FairMutex of one name exclude each other, and the final unlock
// of either wakes a waiter of the other), and its waiters stand in
// Redisson's RFairLock line, kept in Redis and read and written with
// Redisson's meaning, so Go and Java waiters keep their arrival order
// across both:
//
//   - a waiter's place is taken by its first attempt, in the order those
//     attempts reach Redis, and a free lock goes to the first waiter only,
//     never to a newcomer (not even to the goroutine that just unlocked it);
//   - an unlock wakes exactly the next waiter, on a channel of its own
//     (Redisson's "redisson_lock__channel:{<name>}:<field>", message "0"),
//     never every waiter;
//   - each place has Redisson's deadline (WithFairLockWaitTimeout): a first
//     waiter past it is dropped as stale by the next attempt or unlock of
//     either side, and its owner, if alive, queues again at the end;
//   - a waiter of this package also shows it is alive, in a key of ours
//     ("seckillguard_fair_alive:{<name>}") renewed by the Client's watchdog,
//     so the place of one that died is given away at most the Client's
//     watchdog timeout (WithWatchdogTimeout, default 30s) after its last
//     renewal, wherever it stands, by the next call of a Client of this
//     package on the name (Redisson's clients do not read that key: on a
//     name only Java clients touch, a dead Go waiter holds the line until
//     its Redisson deadline, as a dead Java waiter does);
//   - a waiter that gives up (TryLock's wait, its context, Close) leaves the
//     line at once, as Redisson's does, and wakes the next waiter if the
//     lock is free;
//   - the first waiter tries again when the holder's lease ends at the
//     latest, and when it takes the lock it tells the next one its lease,
//     so a line of holders whose leases run out without an unlock moves on
//     at the pace of those leases;
//   - a dead Java waiter first in line keeps the free lock from everyone
//     until its deadline (Redisson's own stuck fair lock): the Client logs
//     it, and Client.Inspect shows each waiter's side and deadline.
//
// Fairness costs round trips: a contended acquisition takes three calls of
// the acquire script (the first attempt, which takes a place in line; the
// attempt after subscribing to the waiter's own channel, which catches an
// unlock that came in between, as Redisson's does; the attempt when woken)
// and a subscription of its own, and its release a fourth script call: on
// a hot key many times the Redis work of a Mutex's acquisition, and less
// throughput (docs/BENCHMARKS.md has the figures). Prefer a Mutex unless
// arrival order across processes matters.
//
// A FairMutex does no I/O until used and may be copied freely.
type FairMutex struct {
	m         *Mutex
	keys      []string // lock, queue, deadlines, channel prefix, liveness, waits, token counter
	leaveKeys []string // lock, queue, deadlines, channel prefix, liveness, waits
	aliveKeys []string // liveness, waits, deadlines: the watchdog's fair_alive.lua
}

// newFairMutex returns the FairMutex of the engine c (nil: of a nil Client): see
// Client.FairMutex.
func newFairMutex(c *engine, name string) *FairMutex {
	f := &FairMutex{m: newMutex(c, name)}
	if f.m.checkErr == nil {
		k := f.m.key
		f.leaveKeys = []string{k, derived(queuePrefix, k), derived(timeoutPrefix, k), f.m.unlockCh,
			derived(alivePrefix, k), derived(waitPrefix, k)}
		f.aliveKeys = []string{f.leaveKeys[4], f.leaveKeys[5], f.leaveKeys[2]}
		f.keys = append(append([]string{}, f.leaveKeys...), f.m.keys[1])
	}
	return f
}

// Name returns the lock's name as given to Client.FairMutex.
func (f *FairMutex) Name() string {
	if f == nil {
		return ""
	}
	return f.m.given
}

func (f *FairMutex) usable() error {
	if f == nil {
		return fmt.Errorf("%w: nil fair mutex", ErrInvalid)
	}
	return f.m.usable()
}

// Lock takes its place in line and waits until it is first and the lock is
// free, or until ctx ends; otherwise it behaves as Mutex.Lock: the returned
// context holds the lock, carries its fencing token and is cancelled with
// cause ErrLost if the lock is lost, and ends with ctx (see Mutex.Lock). A
// context that holds the lock (through a FairMutex or a Mutex of the name)
// re-enters it at once, without queueing.
func (f *FairMutex) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return f.acquire(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: after wait it leaves the line and
// returns ErrNotAcquired. wait 0 makes one attempt, which succeeds only when
// the lock is free and nobody is in line. A negative wait is an error
// (ErrInvalid).
func (f *FairMutex) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(f.Name(), wait); err != nil {
		return ctx, err
	}
	return f.acquire(ctx, wait, opts)
}

func (f *FairMutex) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := f.usable(); err != nil {
		return ctx, err
	}
	w := &fairWaiter{FairMutex: f, wait: msArg(f.m.c.opts.fairWait)}
	if wait > 0 {
		w.wait = msArg(wait)
	}
	return f.m.c.acquire(ctx, w, f.m.key, exclusive, f.m.hk, f.m.name, wait, opts)
}

// A fairWaiter is the kind of one FairMutex acquisition: the FairMutex with
// the wait its place in line is counted with, as Redisson's RFairLock counts
// it (TryLock's wait when positive, else WithFairLockWaitTimeout), and what
// its attempts saw of a stuck line.
type fairWaiter struct {
	*FairMutex
	wait    string    // msArg
	stalled time.Time // when an attempt first found the lock free and a foreign waiter first; zero when not
	warned  bool      // the stuck line was logged
}

// Unlock releases one level of the lock held by ctx, as Mutex.Unlock does;
// the final Unlock wakes the first live waiter in line.
func (f *FairMutex) Unlock(ctx context.Context) error {
	if err := f.usable(); err != nil {
		return err
	}
	return f.m.c.unlock(ctx, f.m.hk, f.m.name)
}

// A fairWaiter is the kind of the holds a FairMutex takes; the methods that
// need nothing of one acquisition are the FairMutex's.

func (f *fairWaiter) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	c := f.m.c
	lease, _ := c.leaseArgs(h)
	mark := c.lineMarkOf(f.channel(h))
	r, err := readPair(fairAcquireScript.run(ctx, via, f.keys, lease, h.field, 0, f.wait, time.Now().UnixMilli(), c.leaseMS, c.publish, c.tokenTTL))
	if err != nil {
		return false, 0, err
	}
	switch {
	case r.is(1):
		h.token = fencing.Token(r.value)
		return true, 0, nil
	case r.is(0), r.is(2), r.is(3):
		c.inLine(h, fairAliveScript, f.aliveKeys, []any{h.field})
		if c.linePlace(f.channel(h), r.is(2), mark) {
			return false, 0, nil // a Mutex's unlock came meanwhile: see lineWake
		}
		if r.is(3) {
			return false, f.stuck(ctx, h, time.Duration(r.value)*time.Millisecond), nil
		}
		f.stalled = time.Time{}
		return false, retryAfter(c.link, r.value), nil
	}
	return false, 0, r.unexpected("fair acquire")
}

// stuck handles an attempt that found the lock free and a foreign waiter
// (Redisson's) first in line, whose deadline is d away: a live one takes the
// lock at once, so the waiter looks again after foreignLook, and if that
// waiter is still first then, the Client logs the stuck line once and waits
// for its deadline (or a wake-up).
func (f *fairWaiter) stuck(ctx context.Context, h *hold, d time.Duration) time.Duration {
	if f.stalled.IsZero() {
		f.stalled = time.Now()
		return min(d, foreignLook)
	}
	if !f.warned && time.Since(f.stalled) >= foreignLook {
		f.warned = true
		c := f.m.c
		head, _ := c.rdb.LIndex(ctx, f.keys[1], 0).Result()
		c.opts.logger.WarnContext(h.logContext(ctx), "lock: a fair lock is free but its first waiter, a foreign client's (Redisson's), does not take it; the line waits until that waiter's deadline",
			"lock", f.m.name, "waiter", head, "deadline", time.Now().Add(d))
	}
	return d
}

func (f *FairMutex) reenter(ctx context.Context, h *hold) (bool, error) {
	c := f.m.c
	_, lease := c.leaseArgs(h)
	r, err := readPair(c.run(ctx, fairAcquireScript, f.keys, lease, h.field, h.levels, msArg(c.opts.fairWait), time.Now().UnixMilli(), c.leaseMS, c.publish, c.tokenTTL))
	if err != nil {
		return false, err
	}
	return r.is(1), nil
}

func (f *FairMutex) release(ctx context.Context, h *hold) (int64, error) {
	c := f.m.c
	return c.run(ctx, fairReleaseScript, f.leaveKeys, h.field, h.levels, c.publish, time.Now().UnixMilli()).Int64()
}

func (f *fairWaiter) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired && !h.queued {
		return
	}
	c := f.m.c
	drop := "0"
	if acquired {
		drop = "1"
	}
	err := f.leave(ctx, h.field, drop)
	switch {
	case err == nil:
	case acquired:
		c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not leave a fair lock's line; the place is given away after the watchdog timeout",
			"lock", f.m.name, "timeout", c.opts.watchdogTimeout, "err", err)
	default:
		// The acquisition is over for good (see engine.acquire): its field is
		// never used again, and a leave that lands twice changes nothing
		// (fair_leave.lua lowers only the waiters behind a place it finds).
		// So it is retried until it gets through, or until the place is
		// anyone's to give away (its liveness ran out): Redisson's line keys
		// have no expiry, and on a name nobody calls again the place would
		// stay for good.
		c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not leave a fair lock's line; retried in the background",
			"lock", f.m.name, "timeout", c.opts.watchdogTimeout, "err", err)
		field, until := h.field, time.Now().Add(c.opts.watchdogTimeout)
		c.goBackground(func() { f.leaveLater(field, until) })
	}
}

// leave takes the waiter field out of the line (and, when drop is "1", a
// first-level hold of it that an acquisition whose reply was lost left).
func (f *fairWaiter) leave(ctx context.Context, field, drop string) error {
	c := f.m.c
	return c.run(ctx, fairLeaveScript, f.leaveKeys, field, c.publish, drop, f.wait, time.Now().UnixMilli()).Err()
}

// leaveLater retries the leave of field, a waiter that gave up, until it
// gets through, the Client closes or until passes.
func (f *fairWaiter) leaveLater(field string, until time.Time) {
	c := f.m.c
	for backoff := 50 * time.Millisecond; time.Now().Before(until); backoff = min(2*backoff, time.Second) {
		select {
		case <-time.After(backoff):
		case <-c.done:
			return
		}
		ctx, cancel := c.backgroundContext(time.Second)
		err := f.leave(ctx, field, "0")
		cancel()
		if err == nil {
			return
		}
	}
}

func (f *FairMutex) renewal(h *hold) (*script, []string, []any) {
	return f.m.renewal(h)
}

// channel is the waiter's own channel: Redisson's
// "redisson_lock__channel:{<name>}:<clientUUID>:<ownerID>".
func (f *FairMutex) channel(h *hold) string { return f.m.unlockCh + ":" + h.field }
func (f *FairMutex) shared() bool           { return false }

// alsoWokenBy is the Mutex's unlock channel: the first waiter in line is
// woken by a Mutex's unlock too (see lineWake).
func (f *FairMutex) alsoWokenBy() string { return f.m.unlockCh }
func (f *FairMutex) tokens() bool        { return true }

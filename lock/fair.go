package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// Redisson's names for a fair lock's wait line.
const (
	queuePrefix   = "redisson_lock_queue"
	timeoutPrefix = "redisson_lock_timeout"
)

// A FairMutex is a Mutex granted in arrival order across every Client: first
// come, first served. Its holds are the Mutex's (the same hash, tokens and
// re-entry through the context; a Mutex and a FairMutex of one name exclude
// each other, and the final unlock of either wakes a waiter of the other),
// and its waiters stand in one line kept in Redis:
//
//   - a waiter's place is taken by its first attempt, in the order those
//     attempts reach Redis, and a free lock goes to the first live waiter
//     only, never to a newcomer (not even to the goroutine that just
//     unlocked it);
//   - an unlock wakes exactly the next waiter, on a channel of its own,
//     never every waiter;
//   - each place carries a deadline from the Redis server's clock, renewed
//     by the Client's watchdog while its waiter waits; the place of a waiter
//     that died is given away once its deadline passes, at most the Client's
//     watchdog timeout (WithWatchdogTimeout, default 30s) after its last
//     renewal, so a dead waiter cannot freeze the lock for long;
//   - a waiter that gives up (TryLock's wait, its context, Close) leaves the
//     line at once and wakes the next waiter if the lock is free;
//   - the first waiter tries again when the holder's lease ends at the
//     latest, and when it takes the lock it tells the next one its lease,
//     so a line of holders whose leases run out without an unlock moves on
//     at the pace of those leases.
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
	keys      []string // lock, queue, deadlines, channel prefix, token counter
	leaveKeys []string // lock, queue, deadlines, channel prefix
}

// FairMutex returns the fair lock called name. It does no I/O; an invalid
// name is reported by the first operation.
func (c *Client) FairMutex(name string) *FairMutex {
	f := &FairMutex{m: newMutex(c, name)}
	if f.m.checkErr == nil {
		k := f.m.key
		f.leaveKeys = []string{k, derived(queuePrefix, k), derived(timeoutPrefix, k), f.m.unlockCh}
		f.keys = append(append([]string{}, f.leaveKeys...), f.m.keys[1])
	}
	return f
}

// Name returns the lock's name as given to Client.FairMutex.
func (f *FairMutex) Name() string {
	if f == nil {
		return ""
	}
	return f.m.name
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
	return f.m.c.acquire(ctx, f, f.m.key, exclusive, f.m.hk, f.m.name, wait, opts)
}

// Unlock releases one level of the lock held by ctx, as Mutex.Unlock does;
// the final Unlock wakes the first live waiter in line.
func (f *FairMutex) Unlock(ctx context.Context) error {
	if err := f.usable(); err != nil {
		return err
	}
	return f.m.c.unlock(ctx, f.m.hk, f.m.name)
}

// The FairMutex is the kind of the holds it takes.

func (f *FairMutex) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	c := f.m.c
	lease, _ := c.leaseArgs(h)
	mark := c.lineMarkOf(f.channel(h))
	r, err := readPair(fairAcquireScript.run(ctx, via, f.keys, lease, h.field, 0, c.leaseMS, c.publish, c.tokenTTL))
	if err != nil {
		return false, 0, err
	}
	switch {
	case r.is(1):
		h.token = fencing.Token(r.value)
		return true, 0, nil
	case r.is(0), r.is(2):
		c.inLine(h, waitingScript, []string{f.keys[2], f.keys[1]}, []any{h.field})
		if c.linePlace(f.channel(h), r.is(2), mark) {
			return false, 0, nil // a Mutex's unlock came meanwhile: see lineWake
		}
		return false, retryAfter(c, r.value), nil
	}
	return false, 0, r.unexpected("fair acquire")
}

func (f *FairMutex) reenter(ctx context.Context, h *hold) (bool, error) {
	c := f.m.c
	_, lease := c.leaseArgs(h)
	r, err := readPair(c.run(ctx, fairAcquireScript, f.keys, lease, h.field, h.levels, c.leaseMS, c.publish, c.tokenTTL))
	if err != nil {
		return false, err
	}
	return r.is(1), nil
}

func (f *FairMutex) release(ctx context.Context, h *hold) (int64, error) {
	c := f.m.c
	return c.run(ctx, fairReleaseScript, f.leaveKeys, h.field, h.levels, c.publish).Int64()
}

func (f *FairMutex) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired && !h.queued {
		return
	}
	c := f.m.c
	drop := "0"
	if acquired {
		drop = "1"
	}
	if err := c.run(ctx, fairLeaveScript, f.leaveKeys, h.field, c.publish, drop).Err(); err != nil {
		c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not leave a fair lock's line; the place is given away after the watchdog timeout",
			"lock", f.m.name, "timeout", c.opts.watchdogTimeout, "err", err)
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

package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
)

// A Mutex is a reentrant distributed lock in Redisson's RLock layout: a hash
// named after the lock whose field "<clientUUID>:<ownerID>" counts the hold.
//
// Ownership travels in contexts, not goroutines, and is per hold. Lock
// returns a context that holds the lock; locking the same Mutex again with
// that context (or one derived from it) re-enters instead of deadlocking, and
// each Lock needs its own Unlock. Goroutines that share a lock context share
// its hold. A context that does not descend from an acquisition of this lock
// acquires it afresh, whatever other locks it holds: goroutines fanned out
// from one request, each locking the Mutex with the request's context,
// exclude each other.
//
// Waiting is fair within a Client and takes turns between Clients. The
// goroutines of one Client that wait for a lock queue in arrival order; the
// first is woken by the unlock message (pub/sub, bounded by the holder's
// lease: nothing polls). When a holder releases and a goroutine of the same
// Client is waiting, the lock is handed to it in one script call, without
// being freed in between; after a few such handovers in a row the Client
// frees the lock, moves to the back of the unlock channel's subscribers and
// lets the other Clients try first, so every instance of a service gets its
// turn on a hot key. A Java service on Redisson simply sees the lock held.
//
// A Mutex does no I/O until used and may be copied freely; all state lives in
// Redis and in the Client.
type Mutex struct {
	handle
	key      string   // the lock hash
	keys     []string // {lock, token counter}
	renKeys  []string // {lock}: the watchdog's renewal
	relKeys  []string // {lock, unlock channel}
	freeKeys []string // relKeys and the line of a FairMutex of the name, whose next waiter ForceUnlock wakes too
	args     []any    // {lock, token counter, lock, unlock channel}: keys and relKeys boxed once, for the hot path's script calls
	unlockCh string   // where unlock messages are published
	hk       any      // the context key of its holds (see heldKey)
}

func newMutex(c *engine, name string) *Mutex {
	m := &Mutex{handle: handle{c: c, name: name, given: name}}
	if c == nil {
		m.checkErr = fmt.Errorf("%w: nil lock client", ErrInvalid)
		return m
	}
	if name == "" {
		m.checkErr = checkName(name)
		return m
	}
	m.key = c.key(name)
	m.name = m.key
	m.checkErr = checkName(m.key)
	m.unlockCh = derived(channelPrefix, m.key)
	token, line := derived(tokenPrefix, m.key), derived(queuePrefix, m.key)
	keys := []string{m.key, token, m.key, m.unlockCh, line}
	m.keys, m.freeKeys, m.relKeys = keys[0:2:2], keys[2:5:5], keys[2:4:4]
	var lock any = m.key
	m.args = []any{lock, token, lock, m.unlockCh}
	m.renKeys = keys[0:1:1]
	m.hk = c.holdKey(m.key, exclusive)
	return m
}

// Name returns the lock's name as given to Client.Mutex.
func (m *Mutex) Name() string { return m.given }

// usable returns the error every operation starts with, if any.
func (m *Mutex) usable() error {
	if m == nil {
		return fmt.Errorf("%w: nil mutex", ErrInvalid)
	}
	return m.handle.usable()
}

// Lock acquires the lock, waiting as long as it takes or until ctx ends, and
// returns the context that holds it: pass it to Unlock, to re-entries, and to
// the work the lock protects. That context carries the fencing token
// (fencing.FromContext) and is cancelled with cause ErrLost if the lock is
// lost while held. If ctx already holds the lock (it descends from an
// acquisition of it), Lock re-enters it at once; otherwise it acquires the
// lock afresh.
//
// The hold never outlives ctx: when ctx ends, the lock is released, every
// level of it, as its final Unlock would, and the returned context is
// cancelled with ctx's cause; an Unlock that comes later returns nil. With
// context.Background() the lock is held until Unlock.
//
// On error Lock returns ctx unchanged. A caller whose ctx ended gets an error
// matching ctx.Err() under errors.Is.
func (m *Mutex) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return m.acquire(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: it gives up after wait with
// ErrNotAcquired. wait 0 makes exactly one attempt. A negative wait is an
// error (ErrInvalid).
func (m *Mutex) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(m.Name(), wait); err != nil {
		return ctx, err
	}
	return m.acquire(ctx, wait, opts)
}

func (m *Mutex) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := m.usable(); err != nil {
		return ctx, err
	}
	return m.c.acquire(ctx, m, m.key, exclusive, m.hk, m.name, wait, opts)
}

// Unlock releases one level of the lock held by ctx; the lock is free when
// every Lock has been matched by an Unlock. The final Unlock cancels the lock
// context with cause ErrReleased and wakes a waiter; one that hands the lock
// to a waiter of the same Client cancels it before that waiter runs, even
// when the handover then fails (Unlock returns the error then).
//
// Unlock returns ErrNotHeld, and changes nothing, when ctx does not hold the
// lock, and an error matching ErrLost when the lock was lost before it was
// released. It runs even if ctx was cancelled, and returns nil for a hold
// already released because the context it was taken with ended. When Unlock fails with a network error it may be
// called again: a level is never released twice.
func (m *Mutex) Unlock(ctx context.Context) error {
	if err := m.usable(); err != nil {
		return err
	}
	return m.c.unlock(ctx, m.hk, m.name)
}

// The Mutex is the kind of its holds: Redisson's RLock layout.

func (m *Mutex) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	n, err := acquireScript.runIn(ctx, via, h.argv[:], m.args[0:2], m.c.leaseArg(h.lease), h.fieldBox[0], 0, m.c.tokenTTL).Int64()
	if err != nil {
		return false, 0, err
	}
	r := acquireReply(n)
	switch {
	case r.token() > 0:
		h.token = r.token()
		h.top = h.token + tokenBlock - 1
		return true, 0, nil
	case r.held():
		return false, retryAfter(m.c.link, r.pttl()), nil
	}
	return false, 0, fmt.Errorf("unexpected reply %d from the acquire script to a first acquisition", n)
}

func (m *Mutex) reenter(ctx context.Context, h *hold) (bool, error) {
	_, lease := m.c.leaseArgs(h)
	n, err := m.c.run(ctx, acquireScript, m.keys, lease, h.field, h.levels).Int64()
	if err != nil {
		return false, err
	}
	return acquireReply(n).reentered(), nil
}

// An acquireReply is the one integer acquire.lua answers; -1, the one value
// no method below claims, is a re-entry that found the owner's hold gone.
type acquireReply int64

// token is the fencing token of a first acquisition, 0 for any other reply.
func (r acquireReply) token() fencing.Token { return fencing.Token(max(r, 0)) }

// reentered reports a re-entry that added a level.
func (r acquireReply) reentered() bool { return r == 0 }

// held reports a lock held by another owner; pttl says for how long.
func (r acquireReply) held() bool { return r <= -2 }

// pttl is the lock's PTTL when held: -1 for a key without expiry.
func (r acquireReply) pttl() int64 { return -3 - int64(r) }

func (m *Mutex) release(ctx context.Context, h *hold) (int64, error) {
	return releaseScript.runIn(ctx, m.c.rdb, h.argv[:], m.args[2:4], h.fieldBox[0], h.levels, m.c.publish).Int64()
}

func (m *Mutex) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired {
		return
	}
	if err := m.c.run(ctx, releaseScript, m.relKeys, h.field, 1, m.c.publish).Err(); err != nil {
		m.c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not roll back an acquisition of unknown outcome; it expires with its lease",
			"lock", m.name, "lease", h.lease, "err", err)
	}
}

func (m *Mutex) renewal(h *hold) (*script, []string, []any) {
	return renewScript, m.renKeys, h.fieldBox[:]
}

// transfer hands the lock from from, released at its last level, to to, a
// waiter of the same Client: see transfer.lua. to gets the token after
// from's when from has one reserved, and a new block of tokenBlock
// otherwise.
func (m *Mutex) transfer(ctx context.Context, from, to *hold, lease time.Duration) (tok, top fencing.Token, err error) {
	next, _, _ := reservedNext(from)
	n, err := m.c.run(ctx, transferScript, m.keys, from.field, to.field, msArg(lease), int64(next), tokenBlock, m.c.tokenTTL).Int64()
	switch {
	case err != nil || n < 0:
		return fencing.Token(n), 0, err
	case next > 0:
		return next, from.top, nil
	}
	return fencing.Token(n), fencing.Token(n) + tokenBlock - 1, nil
}

// abort removes to's field and from's, each as a last level (see
// multi_release.lua): whichever holds the lock, it is freed and its waiters
// are woken.
func (m *Mutex) abort(ctx context.Context, from, to *hold) error {
	keys := []string{m.key, m.unlockCh, m.key, m.unlockCh}
	err := m.c.run(ctx, multiReleaseScript, keys, m.c.publish, to.field, 1, from.field, 1).Err()
	if err != nil {
		m.c.opts.logger.WarnContext(from.logContext(ctx), "lock: could not free a lock after a handover of unknown outcome; it expires with its lease",
			"lock", m.name, "err", err)
	}
	return err
}

// probe asks for the lock's PTTL: free when there is no lock key.
func (m *Mutex) probe(ctx context.Context, h *hold) (bool, time.Duration, error) {
	d, err := m.c.rdb.PTTL(ctx, m.key).Result()
	if err != nil {
		return false, 0, failed(ctx, m.name, err)
	}
	if d < 0 { // no lock key (or one without expiry, which the attempt reports)
		return true, 0, nil
	}
	return false, d, nil
}

func (m *Mutex) channel(*hold) string { return m.unlockCh }
func (m *Mutex) shared() bool         { return false }
func (m *Mutex) tokens() bool         { return true }

// IsLocked reports whether anyone holds the lock.
func (m *Mutex) IsLocked(ctx context.Context) (bool, error) {
	if err := m.usable(); err != nil {
		return false, err
	}
	if ctx == nil {
		return false, noContext(m.name)
	}
	n, err := m.c.rdb.Exists(ctx, m.key).Result()
	if err != nil {
		return false, wrap(m.name, unavailable(err))
	}
	return n == 1, nil
}

// HoldCount returns how many levels of the lock ctx holds, as Redis records
// them: 0 when ctx does not hold it, also after its final Unlock or its loss.
func (m *Mutex) HoldCount(ctx context.Context) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	return m.c.holdCount(ctx, m.name, m.key, m.hk)
}

// holdCount answers HoldCount for the holds of the exclusive role on key.
func (c *engine) holdCount(ctx context.Context, name, key string, hk any) (int, error) {
	if ctx == nil {
		return 0, noContext(name)
	}
	h := heldVia(ctx, hk)
	if h == nil {
		return 0, nil
	}
	err := h.landedOrLost(ctx)
	switch {
	case !h.held():
		return 0, nil // lost while the transfer that handed it over was on its way
	case err != nil:
		return 0, ctxErr(name, ctx)
	}
	n, err := c.rdb.HGet(ctx, key, h.field).Int()
	if errors.Is(err, redis.Nil) || err != nil && !h.held() {
		// Not held in Redis, or released or lost while asking: the lock
		// context, which ended then, may have cancelled the call.
		return 0, nil
	}
	if err != nil {
		return 0, wrap(name, unavailable(err))
	}
	return n, nil
}

// TTL returns how long the lock lasts unless renewed or released: 0 when it
// is not held, a negative duration when it is held without expiry (not
// written by a lock).
func (m *Mutex) TTL(ctx context.Context) (time.Duration, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	if ctx == nil {
		return 0, noContext(m.name)
	}
	d, err := m.c.rdb.PTTL(ctx, m.key).Result()
	if err != nil {
		return 0, wrap(m.name, unavailable(err))
	}
	if d == -2*time.Nanosecond || d == -2*time.Millisecond {
		return 0, nil
	}
	return d, nil
}

// ForceUnlock deletes the lock whoever holds it and wakes its waiters. The
// holder learns at its next renewal (its context is cancelled with ErrLost)
// and its fenced writes are refused from then on. It reports whether there
// was a lock to delete.
func (m *Mutex) ForceUnlock(ctx context.Context) (bool, error) {
	if err := m.usable(); err != nil {
		return false, err
	}
	if ctx == nil {
		return false, noContext(m.name)
	}
	n, err := m.c.run(ctx, forceUnlockScript, m.freeKeys, m.c.publish).Int64()
	if err != nil {
		return false, wrap(m.name, unavailable(err))
	}
	return n == 1, nil
}

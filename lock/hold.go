package lock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/ctxutil"
)

// A role is the part a hold plays in its lock's Redis layout.
type role uint8

const (
	// exclusive is the owner's field "<clientUUID>:<ownerID>" in a lock hash
	// of Redisson's RLock layout: Mutex, FairMutex, the locks of a MultiLock
	// and the nodes of a RedLock. They share the role, so that a context
	// holding the key through one of them re-enters it through the others
	// instead of waiting for itself.
	exclusive role = iota
	// reader is the owner's read field in an RWMutex hash.
	reader
	// writer is the owner's write field "<clientUUID>:<ownerID>:write".
	writer
	// permit is the owner's member of a Semaphore's sorted set.
	permit
)

// holdID identifies one hold of one lock: its key, its role there and the
// owner id of the acquisition that took it. Every first acquisition gets an
// owner id of its own (ownership is per hold, see heldKey).
type holdID struct {
	key   string
	role  role
	owner int64
}

// A kind is what a lock type tells the machinery all of them share: how to
// take, re-enter, release and renew a hold of its layout. A hold remembers
// the kind that took it; every later operation on the hold goes through it.
type kind interface {
	// attempt tries once to take the first level of h, sending its script
	// through via. On success it sets h.token (for kinds that issue tokens)
	// and reports true; otherwise it reports how long to wait for a wake-up
	// at most before trying again.
	attempt(ctx context.Context, via redis.Scripter, h *hold) (bool, time.Duration, error)
	// reenter adds a level to h in Redis. It reports false when Redis no
	// longer has the hold.
	reenter(ctx context.Context, h *hold) (bool, error)
	// release releases one of h.levels and returns the levels Redis has left,
	// or -1 when it has no hold of h's owner.
	release(ctx context.Context, h *hold) (int64, error)
	// undo removes what a failed or abandoned acquisition may have left
	// behind: h's first level when acquired may be true, and h's place in a
	// wait line. It never fails loudly: what it cannot remove expires.
	undo(ctx context.Context, h *hold, acquired bool)
	// renewal returns the watchdog's batch script for holds of this kind and
	// h's keys and arguments for it.
	renewal(h *hold) (*redis.Script, []string, []any)
	// channel is where the unlock messages that concern h are published.
	channel(h *hold) string
	// shared reports whether several owners may hold the lock at once: a
	// waiter that got it lets the next local waiter try at once.
	shared() bool
	// tokens reports whether holds of this kind issue fencing tokens.
	tokens() bool
}

// A hold is one owner's possession of one lock, from its first acquisition to
// its final release or its loss. Its context is the one Lock returns.
type hold struct {
	c        *Client
	id       holdID
	hk       any    // the context key that carries the hold (see heldKey)
	name     string // as the caller wrote it, for errors
	field    string // the owner's field or member in Redis
	fieldArg []any  // {field}: field boxed once, for the script arguments of every call and the renewal's list

	// sem serialises the acquisitions and releases of this hold, so that the
	// hold count sent to Redis is always the one this process last saw.
	sem chan struct{}

	// Guarded by sem.
	kind     kind
	levels   int
	token    fencing.Token
	top      fencing.Token // the last token reserved for this hold's run of handovers (see tokenBlock); <= token when none is
	lease    time.Duration // lease of every acquisition and renewal
	fixed    bool          // WithLease: no watchdog
	relet    time.Duration // the lease a re-entry under way sets (WithLease), 0 when none
	unsure   bool          // a release failed with an unknown outcome
	retrying bool          // a final release failed; releaseLater retries it
	start    time.Time     // when the first acquisition, or the handover to this hold, was sent
	ack      replicaAck    // replicas that must confirm the first acquisition
	queued   bool          // the owner has a place in a wait line in Redis (kept alive by waiting)
	ended    bool          // released because the context it was taken with ended: a later Unlock returns nil

	// Set once at the first acquisition, before the hold is published.
	parent context.Context // what ctx descends from: the context the hold was taken with
	ctx    context.Context
	cancel context.CancelCauseFunc

	reported atomic.Bool // its end was told to the Observer

	// Guarded by c.mu.
	refs     int  // operations in progress on this hold
	pinned   bool // held: stays registered until released or lost
	lost     bool
	stopLife func() bool // stops the release that parent's end would trigger (see establish)
	expiry   *time.Timer // ends ctx when a fixed lease runs out; nil without one

	renewal renewal // how the watchdog renews the hold
	waiting renewal // how the watchdog keeps the owner's place in a wait line alive
}

// ref returns the hold id, creating it when there is none, and counts the
// caller as using it until unref. hk is the context key that carries it.
func (c *Client) ref(id holdID, hk any, name string) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[id]
	if h == nil {
		h = &hold{c: c, id: id, hk: hk, name: name, field: c.field(id.owner), sem: make(chan struct{}, 1)}
		if id.role == writer {
			h.field += ":write"
		}
		h.fieldArg = []any{h.field}
		h.renewal.owner = h
		c.holds[id] = h
	}
	h.refs++
	return h
}

// refAgain counts the caller as using h, a hold it knows already, until
// unref; h may have been forgotten by the Client meanwhile.
func (c *Client) refAgain(h *hold) {
	c.mu.Lock()
	h.refs++
	c.mu.Unlock()
}

// renewalLost is how the watchdog reports that h's lock is lost: h is
// forgotten and its context ends with cause ErrLost.
func (h *hold) renewalLost(why string) {
	if h.c.lose(h) {
		h.c.opts.logger.WarnContext(h.logContext(context.Background()), "lock: a hold was lost; its context ends with ErrLost",
			"lock", h.name, "why", why)
		h.end(lostError(h.name, why))
	}
}

// logContext is the context to log an event about h with, from a call made
// with ctx: once h is held, the context it was taken with (ended or not),
// so that a log handler finds the request's values there (trace and request
// ids) even for a background call, whose ctx has none; before, ctx.
func (h *hold) logContext(ctx context.Context) context.Context {
	switch {
	case h.parent != nil:
		return h.parent
	case ctx != nil:
		return ctx
	}
	return context.Background()
}

// abandon removes from Redis what is left of h after its lease ran out
// without a renewal getting through, within a second.
func (h *hold) abandon() {
	ctx, cancel := h.c.backgroundContext(time.Second)
	defer cancel()
	if h.enter(ctx) == nil {
		h.kind.undo(ctx, h, true)
		h.leave()
	}
}

// heldVia returns the hold ctx carries under hk when it is still held, or
// nil.
func (c *Client) heldVia(ctx context.Context, hk any) *hold {
	if h := heldBy(ctx, hk); h != nil && c.stillHeld(h) {
		return h
	}
	return nil
}

// unref ends one use of h; an unused hold that is not held is forgotten.
func (c *Client) unref(h *hold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.refs--
	if h.refs == 0 && !h.pinned && c.holds[h.id] == h {
		delete(c.holds, h.id)
	}
}

// pin records that h is held.
func (c *Client) pin(h *hold) {
	c.mu.Lock()
	h.pinned = true
	c.mu.Unlock()
}

// unpin records that h was released.
func (c *Client) unpin(h *hold) {
	c.mu.Lock()
	h.pinned = false
	if h.refs == 0 && c.holds[h.id] == h {
		delete(c.holds, h.id) // released by releaseLater, after its Unlock let go of it
	}
	c.mu.Unlock()
}

// lose records that h was lost and forgets it, so that the owner's next Lock
// starts afresh. It reports whether h was held until now; the caller then
// cancels h's context.
func (c *Client) lose(h *hold) bool {
	c.dog.remove(&h.renewal)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !h.pinned {
		return false
	}
	h.pinned, h.lost = false, true
	if c.holds[h.id] == h {
		delete(c.holds, h.id)
	}
	return true
}

// stillHeld reports whether h is held: neither released nor lost.
func (c *Client) stillHeld(h *hold) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return h.pinned
}

// isLost reports whether h was lost.
func (c *Client) isLost(h *hold) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return h.lost
}

// enter waits for h's semaphore or for ctx to end.
func (h *hold) enter(ctx context.Context) error {
	select {
	case h.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave releases h's semaphore.
func (h *hold) leave() { <-h.sem }

// begin creates h's context at its first acquisition. It descends from ctx,
// carries the hold (for re-entries) and the token (for kinds that issue
// one), and with a fixed lease ends by itself when the lease runs out,
// measured from start (the moment the acquisition was sent, so the context
// never outlives the lock).
func (h *hold) begin(ctx context.Context, start time.Time) {
	h.parent = ctx
	hctx, cancel := context.WithCancelCause(ctx)
	h.cancel = cancel
	if h.fixed {
		h.expireAt(start.Add(h.lease))
	}
	hctx = context.WithValue(hctx, h.hk, h)
	if h.kind.tokens() {
		hctx = fencing.WithToken(hctx, h.token)
	}
	h.ctx = hctx
}

// expireAt makes h's context end with cause ErrLost at t, when its fixed
// lease runs out, instead of whenever it was to end before.
func (h *hold) expireAt(t time.Time) {
	lease := h.lease
	timer := time.AfterFunc(time.Until(t), func() {
		h.cancel(lostError(h.name, "its lease of "+lease.String()+" ran out"))
	})
	h.c.mu.Lock()
	old := h.expiry
	h.expiry = timer
	h.c.mu.Unlock()
	if old != nil {
		old.Stop()
	}
}

// end cancels h's context with cause.
func (h *hold) end(cause error) {
	h.c.ended(h, cause)
	h.cancel(cause)
	h.c.mu.Lock()
	stop, expiry := h.stopLife, h.expiry
	h.stopLife, h.expiry = nil, nil
	h.c.mu.Unlock()
	if stop != nil {
		stop()
	}
	if expiry != nil {
		expiry.Stop()
	}
}

// tieToParent makes h end with the context it was taken with: when that
// context ends, h is released as if its final Unlock had come (see
// parentEnded). It costs no goroutine while h is held, and nothing for a
// context that never ends.
func (c *Client) tieToParent(h *hold) {
	if h.parent.Done() == nil {
		return
	}
	stop := context.AfterFunc(h.parent, h.parentEnded)
	c.mu.Lock()
	if h.pinned {
		h.stopLife, stop = stop, nil
	}
	c.mu.Unlock()
	if stop != nil { // lost or released meanwhile
		stop()
	}
}

// parentEnded releases h, every level of it, because the context it was
// taken with ended: as its final Unlock would, handing it to a waiter of
// this Client or freeing it and waking the others. h's context has ended
// with the parent's cause already; an Unlock that comes later returns nil.
func (h *hold) parentEnded() {
	c := h.c
	c.refAgain(h)
	defer c.unref(h)
	_ = h.enter(context.Background())
	defer h.leave()
	if h.levels == 0 || !c.stillHeld(h) {
		return
	}
	h.ended = true
	h.levels = 1 // the last level's release removes the owner whatever its count
	ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
	defer cancel()
	if err := c.releaseLevel(ctx, h); err != nil && !errors.Is(err, ErrLost) {
		c.opts.logger.DebugContext(h.parent, "lock: releasing a hold whose context ended failed; retried until its lease ends",
			"lock", h.name, "err", err)
	}
}

// levelContext returns the context of a re-entry of h made with ctx, which
// descends from h's context (or from a compound lock's context that ends with
// it) and so ends with the hold already: it only needs h's token when ctx
// carries another one.
func (h *hold) levelContext(ctx context.Context) context.Context {
	if !h.kind.tokens() {
		return ctx
	}
	if tok, _ := fencing.FromContext(ctx); tok != h.token {
		ctx = fencing.WithToken(ctx, h.token)
	}
	return ctx
}

// acquire takes a hold of role on key through kind k for an acquisition of
// its own, or re-enters the hold ctx carries under hk (see heldKey): the one
// way every single-key lock type locks. wait < 0 waits without bound.
func (c *Client) acquire(ctx context.Context, k kind, key string, r role, hk any, name string, wait time.Duration, opts []LockOption) (context.Context, error) {
	if ctx == nil {
		return ctx, noContext(name)
	}
	lo := c.lockOptions(opts)
	if lo.err != nil {
		return ctx, wrap(name, lo.err)
	}
	if ctxutil.Ended(ctx) {
		return ctx, ctxErr(name, ctx)
	}
	if h := heldBy(ctx, hk); h != nil {
		return c.reenterVia(ctx, h, lo)
	}
	h := c.ref(holdID{key, r, c.owners.Add(1)}, hk, name)
	defer c.unref(h)
	if err := h.enter(ctx); err != nil {
		return ctx, ctxErr(name, ctx)
	}
	defer h.leave()

	h.kind = k
	h.top = 0
	h.fixed = lo.lease > 0
	h.lease = c.opts.watchdogTimeout
	if h.fixed {
		h.lease = lo.lease
	}
	h.ack = lo.ack
	called := time.Now()
	err := c.waitFor(ctx, waitSpec{name: name, channel: k.channel(h), wait: wait, lease: h.lease, shared: k.shared(), h: h})
	if err != nil {
		if h.queued {
			c.forget(ctx, h, false)
		}
		return ctx, err
	}
	c.observeIn(ctx, h, EventAcquired, time.Since(called), nil)
	c.establish(ctx, h, h.start)
	c.tieToParent(h)
	return h.ctx, nil
}

// reenterVia adds a level to h, the hold ctx carries, with the options lo.
func (c *Client) reenterVia(ctx context.Context, h *hold, lo lockOptions) (context.Context, error) {
	c.refAgain(h)
	defer c.unref(h)
	if err := h.enter(ctx); err != nil {
		return ctx, ctxErr(h.name, ctx)
	}
	defer h.leave()
	if h.levels == 0 || !c.stillHeld(h) {
		// Released or lost a moment ago: ctx ends with it.
		if c.isLost(h) {
			return ctx, lostHold(h)
		}
		return ctx, wrap(h.name, ErrReleased)
	}
	return c.reenter(ctx, h, lo.lease)
}

// granted records that a releasing holder of this Client handed h the lock:
// h's lease began at at, its token is tok and top the last one reserved.
func (h *hold) granted(at time.Time, tok, top fencing.Token) {
	h.start, h.token, h.top = at, tok, top
}

// attempt runs one acquisition attempt of h, with the replica
// acknowledgement h asks for. An attempt whose outcome is unknown (the call
// may have been applied and only its reply lost, or the caller gave up while
// it was under way) is undone, so that a lock nobody knows it holds does not
// block everyone until its lease ends.
func (c *Client) attempt(ctx context.Context, h *hold) (bool, time.Duration, error) {
	var via redis.Scripter = c.rdb
	var conn *redis.Conn
	if h.ack.replicas > 0 {
		var err error
		if conn, err = c.conn(ctx, h.id.key); err != nil {
			return false, 0, c.attemptFailed(ctx, h, err)
		}
		defer conn.Close()
		via = conn
	}
	ok, retry, err := h.kind.attempt(ctx, via, h)
	if err != nil {
		return false, 0, c.attemptFailed(ctx, h, err)
	}
	if ok && conn != nil {
		if err := c.confirmReplicas(ctx, conn, h.ack); err != nil {
			c.forget(ctx, h, true)
			return false, 0, failed(ctx, h.name, err)
		}
	}
	return ok, retry, nil
}

// attemptFailed handles an attempt that failed with err.
func (c *Client) attemptFailed(ctx context.Context, h *hold, err error) error {
	if outcomeUnknown(err) {
		c.forget(ctx, h, true)
	}
	return failed(ctx, h.name, err)
}

// forget undoes what an acquisition of h that did not complete may have left
// in Redis, within a second and even if ctx has ended.
func (c *Client) forget(ctx context.Context, h *hold, acquired bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if h.queued {
		c.dog.remove(&h.waiting)
	}
	h.kind.undo(rctx, h, acquired)
	h.queued = false
}

// inLine records that h's owner has a place in a wait line in Redis, which
// the watchdog keeps alive with script (the kind's batch script for places in
// line, given h's keys and args) until the owner acquires or gives up. Each
// attempt that leaves the owner in line calls it again: the attempt itself
// renewed the place.
func (c *Client) inLine(h *hold, script *redis.Script, keys []string, args []any) {
	if h.waiting.script == nil {
		channel := h.kind.channel(h)
		h.waiting = renewal{script: script, keys: keys, args: args, lost: func(string) {
			// The place was given away: this process stalled for longer
			// than the watchdog timeout. The next attempt queues again at
			// the end of the line; make it now.
			c.deliver(channel)
		}}
	}
	h.queued = true
	c.dog.add(&h.waiting, time.Now().Add(c.opts.watchdogTimeout))
}

// establish makes h held after its first acquisition, which was sent at
// start. The caller then ties it to ctx's end (tieToParent), unless a
// compound lock releases it with its other locks.
func (c *Client) establish(ctx context.Context, h *hold, start time.Time) {
	if h.queued {
		c.dog.remove(&h.waiting)
		h.queued = false
	}
	h.levels = 1
	h.unsure = false
	h.ended = false
	h.begin(ctx, start)
	c.pin(h)
	if !h.fixed {
		if h.renewal.script == nil {
			// Set once: a renewal round under way may still read them. Every
			// kind that takes holds of one role on one key renews them alike.
			h.renewal.script, h.renewal.keys, h.renewal.args = h.kind.renewal(h)
		}
		c.dog.add(&h.renewal, start.Add(h.lease))
	}
	if c.closed() && c.lose(h) {
		h.end(fmt.Errorf("lock %q: %w: %w", h.name, ErrLost, ErrClosed))
	}
}

// reenter adds a level to h, which ctx holds already. A lease > 0
// (WithLease) applies to the hold from then on, as in Redisson: the hold is
// fixed to it, no longer renewed by the watchdog, and its context ends when
// it runs out, measured from this call. Without one the hold keeps its lease
// as it is (a fixed one its deadline).
func (c *Client) reenter(ctx context.Context, h *hold, lease time.Duration) (context.Context, error) {
	if c.isLost(h) {
		return ctx, lostHold(h)
	}
	if h.retrying {
		// Its final release failed and is retried in the background: the
		// owner keeps the lock after all, so the watchdog renews it again.
		h.retrying = false
		if !h.fixed {
			c.dog.add(&h.renewal, c.dog.leaseEnd(&h.renewal))
		}
	}
	start := time.Now()
	h.relet = lease
	ok, err := h.kind.reenter(ctx, h)
	h.relet = 0
	if err != nil {
		// An unknown outcome needs no rollback: the final release removes
		// the owner whatever count Redis holds.
		return ctx, failed(ctx, h.name, err)
	}
	if !ok {
		if c.lose(h) {
			h.end(lostError(h.name, "its hold was gone when it was re-entered"))
		}
		return ctx, lostHold(h)
	}
	h.levels++
	if lease > 0 {
		if !h.fixed {
			c.dog.remove(&h.renewal)
		}
		h.fixed, h.lease = true, lease
		h.expireAt(start.Add(lease))
	}
	return h.levelContext(ctx), nil
}

// lostHold is the error for an operation on a hold that was lost.
func lostHold(h *hold) error {
	if cause := context.Cause(h.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return wrap(h.name, ErrLost)
}

// unlock releases one level of the hold ctx carries under hk: the one way
// every single-key lock type unlocks.
func (c *Client) unlock(ctx context.Context, hk any, name string) error {
	if ctx == nil {
		return noContext(name)
	}
	h := heldBy(ctx, hk)
	if h == nil {
		if errors.Is(context.Cause(ctx), ErrLost) {
			return wrap(name, ErrLost)
		}
		return wrap(name, ErrNotHeld)
	}
	c.refAgain(h)
	defer c.unref(h)
	_ = h.enter(context.Background())
	defer h.leave()
	if !c.stillHeld(h) {
		switch cause := context.Cause(h.ctx); {
		case h.ended:
			return nil // released when the context it was taken with ended
		case c.isLost(h):
			return lostHold(h)
		case errors.Is(cause, errReleasedLater):
			return nil // the retry of an Unlock that failed, completed meanwhile
		}
		return wrap(name, ErrNotHeld)
	}
	return c.releaseLevel(ctx, h)
}

// releaseLevel releases one level of h, whose semaphore the caller holds.
func (c *Client) releaseLevel(ctx context.Context, h *hold) error {
	if c.isLost(h) {
		return lostHold(h)
	}
	if h.levels == 0 {
		return wrap(h.name, ErrNotHeld)
	}
	renewed := c.releasing(h)
	turn := false
	others := int64(0)
	channel := h.kind.channel(h)
	if h.levels == 1 {
		w, end := c.reserveHandover(h)
		if w == nil && end {
			if others = c.othersListening(ctx, channel); others == 0 {
				// Nobody else waits for a turn: hand over on.
				c.renewTurn(channel)
				w, end = c.reserveHandover(h)
			}
		}
		if w != nil {
			var until time.Time // when h's lease ends unless renewed, if the watchdog renewed it
			if renewed {
				until = c.dog.leaseEnd(&h.renewal)
			}
			return c.handOver(ctx, h, w, until, renewed)
		}
		turn = end
	}
	if turn {
		c.startTurn(channel, others)
	}
	left, err := h.kind.release(context.WithoutCancel(ctx), h)
	if turn {
		c.endTurn(channel)
	}
	return c.settle(h, renewed, left, err)
}

// A handing kind can hand its lock from a holder straight to a waiter of the
// same Client (see cohortLimit).
type handing interface {
	kind
	// transfer hands the lock from from, at its final release, to to,
	// setting a new lease when lease > 0 and keeping the lock's expiry
	// otherwise. It returns to's token and the last token reserved for
	// to's run of handovers, or a negative token when from does not hold
	// the lock any more.
	transfer(ctx context.Context, from, to *hold, lease time.Duration) (tok, top fencing.Token, err error)
	// abort frees the lock after a transfer from from to to whose outcome
	// is unknown, whichever of the two holds it, in one call: the transfer
	// may still be on its way, and finding from's field gone it then
	// changes nothing.
	abort(ctx context.Context, from, to *hold) error
	// probe reports whether h's lock is free, with one command, and if not,
	// how long to wait for an unlock message at most.
	probe(ctx context.Context, h *hold) (bool, time.Duration, error)
}

// handOver releases h's last level by handing the lock to waiter w. until,
// when set, is when h's lease ends unless the watchdog renews it: a waiter
// the watchdog renews too keeps that lease when enough of it is left,
// rather than have the handover set it anew.
func (c *Client) handOver(ctx context.Context, h *hold, w *waiter, until time.Time, renewed bool) error {
	at := time.Now()
	lease := w.h.lease
	if !until.IsZero() && !w.h.fixed && w.h.lease == h.lease && until.Sub(at) > lease/2 {
		at, lease = until.Add(-lease), 0
	}
	tok, top, err := h.kind.(handing).transfer(context.WithoutCancel(ctx), h, w.h, lease)
	switch {
	case err != nil:
		if outcomeUnknown(err) {
			// Maybe handed over, maybe still on its way: free the lock,
			// rather than leave it held for a waiter that does not know,
			// and remove h's field with it, so that a transfer arriving
			// later finds nothing to hand over.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			aerr := h.kind.(handing).abort(rctx, h, w.h)
			cancel()
			if aerr == nil {
				c.handedOver(w, false, at, 0, 0)
				return c.settle(h, renewed, 0, nil)
			}
		}
		c.handedOver(w, false, at, 0, 0)
		return c.settle(h, renewed, 0, err)
	case tok < 0:
		c.handedOver(w, false, at, 0, 0)
		return c.settle(h, renewed, -1, nil)
	}
	c.handedOver(w, true, at, tok, top)
	c.observe(h, EventHandedOver, 0, nil)
	return c.settle(h, renewed, 0, nil)
}

// releasing prepares the release of one level of h: before the final one,
// the watchdog stops renewing it (no renewal may follow the final release).
// It reports whether h was being renewed.
func (c *Client) releasing(h *hold) bool {
	if h.levels == 1 {
		return c.dog.remove(&h.renewal)
	}
	return false
}

// settle records the outcome of releasing one level of h: the levels Redis
// has left, or the error of the call. renewed is what releasing returned.
func (c *Client) settle(h *hold, renewed bool, left int64, err error) error {
	final := h.levels == 1
	if err != nil {
		h.unsure = h.unsure || outcomeUnknown(err)
		if final && !h.retrying {
			// The owner asked to release: renewing the lock now would keep
			// it held for as long as the Client lives if nobody retried.
			// Retry in the background until it is released or its lease
			// ends; a retry by the caller is welcome meanwhile.
			h.retrying = true
			until := time.Now().Add(h.lease)
			if renewed {
				until = c.dog.leaseEnd(&h.renewal)
			}
			c.goBackground(func() { c.releaseLater(h, until) })
		}
		return wrap(h.name, fmt.Errorf("unlock: %w", err))
	}
	switch {
	case left > 0 && !final:
		h.levels--
		h.unsure = false
		return nil
	case left == 0 && final, left < 0 && final && h.unsure:
		// Released now, or by an earlier call whose reply was lost.
		c.released(h)
		if cause := context.Cause(h.ctx); errors.Is(cause, ErrLost) {
			// A fixed lease ran out before the release arrived: the key
			// outlived it by a moment, but the protection had ended.
			return cause
		}
		return nil
	}
	if c.lose(h) {
		h.end(lostError(h.name, "it was not held any more when it was unlocked"))
	}
	return lostHold(h)
}

// releaseLater retries the final release of h, which failed, until it
// succeeds, the caller's own retry succeeds, or h's lease ends at until
// (then the lock has expired in Redis: h is declared lost).
func (c *Client) releaseLater(h *hold, until time.Time) {
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		select {
		case <-time.After(min(backoff, max(time.Until(until), 0))):
		case <-c.done:
			return
		}
		ctx, cancel := c.backgroundContext(max(time.Until(until), 10*time.Millisecond))
		err := h.enter(ctx)
		if err != nil {
			cancel()
			continue
		}
		done := h.levels != 1 || !c.stillHeld(h)
		if !done && !time.Now().Before(until) {
			if c.lose(h) {
				h.end(lostError(h.name, "its release failed and its lease ran out"))
			}
			done = true
		}
		if !done {
			left, err := h.kind.release(ctx, h)
			switch {
			case err != nil:
				h.unsure = h.unsure || outcomeUnknown(err)
			case left == 0 || left < 0 && h.unsure:
				c.releasedWith(h, errReleasedLater)
				done = true
			default:
				if c.lose(h) {
					h.end(lostError(h.name, "it was not held any more when it was unlocked"))
				}
				done = true
			}
		}
		if done {
			h.retrying = false
		}
		h.leave()
		cancel()
		if done {
			return
		}
	}
}

// released records the final release of h.
func (c *Client) released(h *hold) { c.releasedWith(h, ErrReleased) }

// errReleasedLater is the cause of a context whose final release failed and
// was then completed by releaseLater: the caller's own retry of Unlock,
// arriving after that, succeeds too.
var errReleasedLater = fmt.Errorf("%w after a failed unlock was retried", ErrReleased)

func (c *Client) releasedWith(h *hold, cause error) {
	h.levels = 0
	h.unsure = false
	c.dog.remove(&h.renewal)
	c.unpin(h)
	h.end(wrap(h.name, cause))
}

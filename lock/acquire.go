package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// The single-key acquire path: every Mutex, FairMutex, RWMutex side and
// Semaphore acquisition goes through engine.acquire, which takes a hold
// afresh (waitFor, then establish) or re-enters the one the context
// carries, and the checks every kind starts with; one attempt and its
// script arguments are in attempt.go.

// A handle is what every lock value starts its operations with: its Client,
// its name and what was wrong with it when it was made, which every
// operation reports.
type handle struct {
	c        *engine
	name     string // the full Redis name, namespace included: errors and logs show it
	given    string // the name as given: Name returns it
	checkErr error
}

// usable returns the error every operation of the lock starts with, if any:
// bad input when the lock was made, or a Client that cannot work (nil,
// badly made, closed). A lock of several Clients (RedLock) has none here and
// asks each of its own.
func (l *handle) usable() error {
	if l.checkErr != nil {
		return wrap(l.name, l.checkErr)
	}
	if l.c == nil {
		return nil
	}
	if err := l.c.usable(); err != nil {
		return wrap(l.name, err)
	}
	return nil
}

// checkWait returns the error of a bounded wait that is negative, for the
// lock called name: bad input.
func checkWait(name string, wait time.Duration) error {
	if wait < 0 {
		return wrap(name, fmt.Errorf("%w: negative wait %v", ErrInvalid, wait))
	}
	return nil
}

// acquire takes a hold of role on key through kind k for an acquisition of
// its own, or re-enters the hold ctx carries under hk (see heldKey): the one
// way every single-key lock type locks. wait < 0 waits without bound.
func (c *engine) acquire(ctx context.Context, k kind, key string, r role, hk any, name string, wait time.Duration, opts []LockOption) (context.Context, error) {
	if ctx == nil {
		return ctx, noContext(name)
	}
	lo := c.lockOptions(opts)
	if lo.err != nil {
		return ctx, wrap(name, lo.err)
	}
	if ctxend.Ended(ctx) {
		return ctx, ctxErr(name, ctx)
	}
	if h := heldBy(ctx, hk); h != nil {
		return c.reenterVia(ctx, h, lo)
	}
	h := c.holds.ref(c, holdID{key, r, c.owners.Add(1)}, hk, name)
	defer c.holds.unref(h)
	if err := h.enter(ctx); err != nil {
		return ctx, ctxErr(name, ctx)
	}
	defer h.leave()

	h.prepare(k, lo)
	h.top = 0
	h.ack = lo.ack
	var called time.Time // for the Observer only: a clock read less per Lock without one
	if c.opts.observer != nil {
		called = time.Now()
	}
	err := c.waitFor(ctx, waitSpec{name: name, channel: k.channel(h), wait: wait, lease: h.lease, shared: k.shared(), h: h})
	if err != nil {
		if h.queued {
			c.forget(ctx, h, false)
		}
		return ctx, err
	}
	if c.opts.observer != nil {
		c.observeIn(ctx, h, EventAcquired, time.Since(called), nil)
	}
	c.establish(ctx, h, h.start)
	h.tieToParent()
	return h.ctx, nil
}

// reenterVia adds a level to h, the hold ctx carries, with the options lo.
func (c *engine) reenterVia(ctx context.Context, h *hold, lo lockOptions) (context.Context, error) {
	c.holds.refAgain(h)
	defer c.holds.unref(h)
	if err := h.enter(ctx); err != nil {
		return ctx, ctxErr(h.name, ctx)
	}
	defer h.leave()
	if h.levels == 0 || !c.holds.stillHeld(h) || h.mayBeReleased() {
		// Released or lost a moment ago, or its release may still land:
		// ctx ends with it.
		if c.holds.isLost(h) {
			return ctx, lostHold(h)
		}
		return ctx, wrap(h.name, ErrReleased)
	}
	return c.reenter(ctx, h, lo.lease)
}

// establish makes h held after its first acquisition, which was sent at
// start. The caller then ties it to ctx's end (tieToParent), unless a
// compound lock releases it with its other locks.
func (c *engine) establish(ctx context.Context, h *hold, start time.Time) {
	if h.queued {
		c.dog.remove(h.waiting)
		h.queued = false
	}
	h.levels = 1
	h.unsure = false
	h.ended = false
	h.begin(ctx, start)
	c.holds.pin(h)
	if !h.fixed {
		h.setRenewal()
		if !h.handed {
			c.dog.add(&h.renewal, start.Add(h.lease))
		} else if !c.adoptHandover(h) && c.holds.lose(h) {
			h.end(lostError(h.name, "it was lost right after it was handed over"))
		}
	}
	h.handed = false
	if c.closed() && c.holds.lose(h) {
		h.end(closedError(h.name))
	}
	if cause := context.Cause(h.ctx); h.fixed && errors.Is(cause, ErrLost) && c.holds.lose(h) {
		h.end(cause) // its lease ran out before it was pinned (see expireAt)
	}
}

// reenter adds a level to h, which ctx holds already. A re-entry never
// weakens the hold it enters: it never shortens the lease and never turns the
// watchdog off. A lease > 0 (WithLease) extends a fixed hold to at least d
// from this call (its context then ends at the later of the two deadlines)
// and does nothing to a hold the watchdog renews. Without one the hold keeps
// its lease as it is (a fixed one its deadline).
func (c *engine) reenter(ctx context.Context, h *hold, lease time.Duration) (context.Context, error) {
	if c.holds.isLost(h) {
		return ctx, lostHold(h)
	}
	if !h.fixed {
		lease = 0 // the watchdog renews the hold: a lease would only weaken it
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
		if c.holds.lose(h) {
			h.end(lostError(h.name, "its hold was gone when it was re-entered"))
		}
		return ctx, lostHold(h)
	}
	h.reentered(start) // a hold whose release failed, not applied, is the owner's again
	if lease > 0 {
		h.extendTo(start.Add(lease))
	}
	if !c.holds.stillHeld(h) {
		// Its lease ran out while the re-entry was on its way: the hold has
		// ended and its owner was told, so the level the re-entry added (and
		// the lease it may have stretched in Redis) must not keep the lock
		// held by nobody.
		c.dropOwner(ctx, h)
		return ctx, lostHold(h)
	}
	return h.levelContext(ctx), nil
}

// dropOwner removes h's owner from Redis, whatever count it has there, within
// a second and even if ctx has ended: the hold ended while a call that added
// to it was on its way.
func (c *engine) dropOwner(ctx context.Context, h *hold) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	levels := h.levels
	h.levels = 1 // a last level: every kind's release removes the owner whatever its count
	_, err := h.kind.release(rctx, h)
	h.levels = levels
	if err != nil {
		c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not remove a re-entry that came after its hold ended; it expires with its lease",
			"lock", h.name, "err", err)
	}
}

// prepare sets what a first acquisition of h through k with the options lo
// needs: its kind, and its lease, lo's (fixed: nothing renews it) or else the
// watchdog timeout of h's Client.
func (h *hold) prepare(k kind, lo lockOptions) {
	h.kind = k
	h.fixed = lo.lease > 0
	h.lease = h.c.opts.watchdogTimeout
	if h.fixed {
		h.lease = lo.lease
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

// leaseArg returns the script argument for a lease of d (see msArg), boxed
// once for the watchdog timeout, the lease of most holds.
func (c *link) leaseArg(d time.Duration) any {
	if d == c.opts.watchdogTimeout {
		return c.leaseMS
	}
	return msArg(d)
}

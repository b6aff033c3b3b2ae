package lock

import (
	"context"
	"errors"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// The compound locks, MultiLock and RedLock, hold one Mutex hold per part (a
// lock of the set, a node) and share the way they take them: the holds of
// an acquisition are found or made, counted as in use and entered (their
// semaphores) in one global order that every compound lock follows, so
// that two acquisitions of one owner never wait for each other's
// semaphores; a part the acquiring context holds already is re-entered.

// startAcquire returns the error an acquisition with ctx of the compound
// lock called name, with the options lo, starts with, if any: no context,
// bad options, a context that ended already.
func startAcquire(ctx context.Context, name string, lo lockOptions) error {
	if ctx == nil {
		return noContext(name)
	}
	if lo.err != nil {
		return wrap(name, lo.err)
	}
	if ctxend.Ended(ctx) {
		return ctxErr(name, ctx)
	}
	return nil
}

// The parts of one operation of a compound lock: the hold of each part, in
// the order of the lock's parts.
type parts struct {
	holds   []*hold
	carried []bool // holds[i] was held by the acquiring context already: the acquisition re-enters it
}

// enterParts is the prologue of an acquisition with ctx of the compound lock
// called name over locks. A lock ctx holds already is carried (re-entered),
// when onlyHeld only while it is still held; the others are taken afresh,
// under one new owner id per Client for the whole acquisition. Every hold
// is counted as in use and entered in order (indexes into locks; nil: their
// own order). When ctx ends first it returns ctx's error, and when a carried
// hold's failed release may still land (see mayBeReleased) ErrReleased, as
// the lock's own re-entry does; then it has undone everything. Otherwise
// the caller ends with exit.
func enterParts(ctx context.Context, name string, locks []*Mutex, order []int, onlyHeld bool) (*parts, error) {
	p := &parts{holds: make([]*hold, len(locks)), carried: make([]bool, len(locks))}
	for i, m := range locks {
		c := m.c
		if h := heldBy(ctx, m.hk); h != nil && (!onlyHeld || h.held()) {
			h.use()
			p.holds[i], p.carried[i] = h, true
			continue
		}
		owner := int64(0)
		for j := range locks[:i] {
			if locks[j].c == c && !p.carried[j] {
				owner = p.holds[j].id.owner
				break
			}
		}
		if owner == 0 {
			owner = c.owners.Add(1)
		}
		p.holds[i] = c.holds.ref(c, holdID{m.key, exclusive, owner}, m.hk, m.name)
	}
	for n := range p.holds {
		if p.holds[partAt(order, n)].enter(ctx) != nil {
			for k := range n {
				p.holds[partAt(order, k)].leave()
			}
			unrefAll(p.holds)
			return nil, ctxErr(name, ctx)
		}
	}
	for i, h := range p.holds {
		if p.carried[i] && h.mayBeReleased() {
			// Its failed release may still land: ctx ends with it.
			p.exit()
			return nil, wrap(h.name, ErrReleased)
		}
	}
	return p, nil
}

// stillCarried returns the error of an acquisition whose context carried a
// hold of p that was released or lost a moment ago (ctx ends with it), or
// nil when every carried hold is held still. The caller holds the
// semaphores of p's holds.
func (p *parts) stillCarried() error {
	for i, h := range p.holds {
		if !p.carried[i] {
			continue
		}
		if h.levels == 0 || !h.held() {
			if h.isLost() {
				return h.lostErr()
			}
			return wrap(h.name, ErrReleased)
		}
	}
	return nil
}

// reentryArg returns the lease argument of a compound lock's re-entry of h,
// a hold its context carries, asked with the lease of WithLease (0: none).
// A re-entry never weakens the hold it enters: a fixed hold is extended to
// lease where that lasts longer than what is left of it ("0": it keeps its
// deadline), and a hold the watchdog renews gets its own lease, as a
// renewal would set it, whatever lease asks for. The scripts only ever move
// a re-entered lock's expiry later.
func reentryArg(h *hold, lease time.Duration) any {
	switch {
	case h.fixed && lease > 0:
		return h.c.leaseArg(lease)
	case h.fixed:
		return "0"
	}
	return h.c.leaseArg(h.lease)
}

// reenteredBy is the end of an acquisition of a compound lock, sent at
// start with the lease of WithLease (0: none), that re-entered h, a hold its
// context carried: h is re-entered (see reentered), a fixed hold is
// extended to at least start+lease (see reentryArg: a hold the watchdog
// renews is left as it is), and the lock's counter is at the compound
// lock's token now, above the tokens h reserved for handing its lock over.
// The caller holds h's semaphore.
func reenteredBy(h *hold, start time.Time, lease time.Duration) {
	h.reentered(start)
	if h.fixed && lease > 0 {
		h.extendTo(start.Add(lease))
	}
	h.top = h.token
}

// endCarried releases the n levels that an acquisition of a compound lock
// added to h, a hold its context carried, because that context ended: as
// the final Unlocks of the acquisition would. A level whose release fails
// is let go of all the same (nobody calls again for it): its count in Redis
// may stay one above, which is harmless, since the final release removes
// the owner whatever the count (and a failed final release is retried by
// releaseLater). The caller holds h's semaphore.
func endCarried(h *hold, n int) {
	c := h.c
	for k := n; k > 0 && h.levels > 0 && h.held(); k-- {
		ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
		err := c.releaseLevel(ctx, h)
		cancel()
		if err != nil && !errors.Is(err, ErrLost) && h.levels > 1 && h.held() {
			h.levels--
			c.opts.logger.DebugContext(h.logContext(ctx), "lock: releasing a compound lock's level of a hold it re-entered failed; the final release removes it",
				"lock", h.name, "err", err)
		}
	}
}

// partAt returns the index of the n-th part in order: order[n], or n for the
// parts' own order (nil).
func partAt(order []int, n int) int {
	if order == nil {
		return n
	}
	return order[n]
}

// exit ends what enterParts began: it leaves every hold and ends its use.
func (p *parts) exit() { exitAll(p.holds) }

// enterAll counts every hold of holds as in use and enters them, in that
// order, whatever ctx: for the operations that must run (an Unlock, the
// release when an acquisition's context ended). exitAll ends them.
func enterAll(holds []*hold) {
	for _, h := range holds {
		h.use()
	}
	for _, h := range holds {
		_ = h.enter(context.Background())
	}
}

// exitAll leaves every hold of holds and ends its use.
func exitAll(holds []*hold) {
	for _, h := range holds {
		h.leave()
	}
	unrefAll(holds)
}

func unrefAll(holds []*hold) {
	for _, h := range holds {
		h.unuse()
	}
}

// A compoundHold is one acquisition of a compound lock and its re-entries:
// the holds of its parts and the context Lock returned. Its fields change
// under its kind's rule (a MultiLock's under its parts' semaphores, a
// RedLock's under redHold.mu).
type compoundHold struct {
	holds   []*hold         // its parts' holds, in the order of the lock's parts (a RedLock's: nil for a node it did not take)
	carried []bool          // holds[i] was held by the acquiring context already: the acquisition re-entered it
	parent  context.Context // the context it was taken with

	levels int
	ended  bool // released because the context it was taken with ended

	token    fencing.Token
	ctx      context.Context
	cancel   context.CancelCauseFunc
	expire   context.CancelFunc // releases a validity timer of ctx; nil without one
	stopLife func() bool        // stops the release that parent's end triggers (see publish)
	stops    []func() bool      // stop watching the parts (see watch)
}

// begin starts ch's context below parent, the context the acquisition was
// made with; the kind adds what it needs to it and passes it to publish.
func (ch *compoundHold) begin(parent context.Context) context.Context {
	ch.parent = parent
	ctx, cancel := context.WithCancelCause(parent)
	ch.cancel = cancel
	return ctx
}

// watch calls ended with the index and the cause of each part whose hold's
// context ends, until stopParts.
func (ch *compoundHold) watch(ended func(i int, cause error)) {
	for i, h := range ch.holds {
		if h == nil {
			continue
		}
		hctx := h.ctx
		ch.stops = append(ch.stops, context.AfterFunc(hctx, func() { ended(i, context.Cause(hctx)) }))
	}
}

// publish finishes ch's context, ctx (from begin): it carries v (the kind's
// hold) under key and ch.token, and when ch.parent ends, parentEnded
// releases the acquisition (unless stopLife stops it first). It returns
// ch.ctx.
func (ch *compoundHold) publish(ctx context.Context, key, v any, parentEnded func()) context.Context {
	ctx = context.WithValue(ctx, key, v)
	ch.ctx = fencing.WithToken(ctx, ch.token)
	if ch.parent.Done() != nil {
		ch.stopLife = context.AfterFunc(ch.parent, parentEnded)
	}
	return ch.ctx
}

// stopParts stops watching the parts.
func (ch *compoundHold) stopParts() {
	for _, stop := range ch.stops {
		stop()
	}
}

// stopWatching stops the release at parent's end and the watching of the
// parts: the final Unlock is under way.
func (ch *compoundHold) stopWatching() {
	if ch.stopLife != nil {
		ch.stopLife()
		ch.stopLife = nil
	}
	ch.stopParts()
}

// heldCompound returns the compound hold of type H that ctx carries under
// key, for an Unlock with ctx of the compound lock called name, or the
// error of that Unlock when ctx carries none: ErrLost when ctx ended with
// a loss, ErrNotHeld otherwise.
func heldCompound[H any](ctx context.Context, key any, name string) (H, error) {
	var none H
	if ctx == nil {
		return none, noContext(name)
	}
	ch, ok := ctx.Value(key).(H)
	if !ok {
		if errors.Is(context.Cause(ctx), ErrLost) {
			return none, wrap(name, ErrLost)
		}
		return none, wrap(name, ErrNotHeld)
	}
	return ch, nil
}

// released ends ch's context after the final Unlock of the compound lock
// called name, with cause ErrReleased; it returns the cause when ch had
// been lost before (an error matching ErrLost), else nil.
func (ch *compoundHold) released(name string) error {
	ch.cancel(wrap(name, ErrReleased))
	if ch.expire != nil {
		ch.expire()
	}
	if cause := context.Cause(ch.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return nil
}

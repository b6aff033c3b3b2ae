package lock

import (
	"context"

	"github.com/seckillguard/seckillguard/fencing"
)

// The compound locks, MultiLock and RedLock, hold one Mutex hold per part (a
// lock of the set, a node) and share the way they take them: the holds of
// an acquisition are found or made, counted as in use and entered (their
// semaphores) in one global order that every compound lock follows, so
// that two acquisitions of one owner never wait for each other's
// semaphores; a part the acquiring context holds already is re-entered.

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
// own order). When ctx ends first it returns ctx's error and has undone
// everything; otherwise the caller ends with exit.
func enterParts(ctx context.Context, name string, locks []*Mutex, order []int, onlyHeld bool) (*parts, error) {
	p := &parts{holds: make([]*hold, len(locks)), carried: make([]bool, len(locks))}
	for i, m := range locks {
		c := m.c
		if h := heldBy(ctx, m.hk); h != nil && (!onlyHeld || c.holds.stillHeld(h)) {
			c.holds.refAgain(h)
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
		if p.holds[at(order, n)].enter(ctx) != nil {
			for k := range n {
				p.holds[at(order, k)].leave()
			}
			unrefAll(p.holds)
			return nil, ctxErr(name, ctx)
		}
	}
	return p, nil
}

// at returns the index of the n-th part in order: order[n], or n for the
// parts' own order (nil).
func at(order []int, n int) int {
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
		h.c.holds.refAgain(h)
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
		h.c.holds.unref(h)
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
	stopLife func() bool   // stops the release that parent's end triggers (see publish)
	stops    []func() bool // stop watching the parts (see watch)
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

package lock

import "context"

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

package lock

import (
	"sync"
	"time"
)

// A holdTable is a Client's registry of holds: which holds exist, which are
// in use by an operation, which are held, which were lost. It owns the
// fields of every hold that change outside the hold's semaphore (refs,
// pinned, lost, stopLife, expiry); h.sem serialises the operations on one
// hold, the watchdog owns its renewals and the wait queues (lines.qmu) its
// waiters.
//
// A hold is registered while an operation uses it (ref … unref) or while it
// is held (pin … unpin or lose): the next acquisition of the same lock by
// the same owner finds it, and Close finds every hold still held.
type holdTable struct {
	mu sync.Mutex
	m  map[holdID]*hold
}

func newHoldTable() holdTable { return holdTable{m: make(map[holdID]*hold)} }

// ref returns the hold id of c, creating it when there is none, and counts
// the caller as using it until unref. hk is the context key that carries it.
func (t *holdTable) ref(c *engine, id holdID, hk any, name string) *hold {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.m[id]
	if h == nil {
		h = &hold{c: c, id: id, hk: hk, name: name}
		h.field = c.field(&h.fieldBytes, id.owner, id.role)
		h.fieldBox[0] = h.field
		h.renewal.owner = h
		t.m[id] = h
	}
	h.refs++
	return h
}

// refAgain counts the caller as using h, a hold it knows already, until
// unref; h may have been forgotten by the table meanwhile.
func (t *holdTable) refAgain(h *hold) {
	t.mu.Lock()
	h.refs++
	t.mu.Unlock()
}

// unref ends one use of h; an unused hold that is not held is forgotten.
func (t *holdTable) unref(h *hold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h.refs--
	if h.refs == 0 && !h.pinned && t.m[h.id] == h {
		delete(t.m, h.id)
	}
}

// pin records that h is held.
func (t *holdTable) pin(h *hold) {
	t.mu.Lock()
	h.pinned = true
	t.mu.Unlock()
}

// unpin records that h was released.
func (t *holdTable) unpin(h *hold) {
	t.mu.Lock()
	h.pinned = false
	if h.refs == 0 && t.m[h.id] == h {
		delete(t.m, h.id) // released by releaseLater, after its Unlock let go of it
	}
	t.mu.Unlock()
}

// lose records that h was lost and forgets it, so that the owner's next Lock
// starts afresh; the watchdog stops renewing it, and the calls waiting for
// the transfer that handed h over, if it is still on its way, stop waiting
// (see hold.enter). It reports whether h was held until now; the caller
// then cancels h's context.
func (t *holdTable) lose(h *hold) bool {
	h.c.dog.remove(&h.renewal)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !h.pinned {
		return false
	}
	h.pinned, h.lost = false, true
	if t.m[h.id] == h {
		delete(t.m, h.id)
	}
	if p := h.inflight.Load(); p != nil {
		p.lose()
	}
	return true
}

// stillHeld reports whether h is held: neither released nor lost.
func (t *holdTable) stillHeld(h *hold) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return h.pinned
}

// isLost reports whether h was lost.
func (t *holdTable) isLost(h *hold) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return h.lost
}

// held returns every hold registered now.
func (t *holdTable) held() []*hold {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*hold, 0, len(t.m))
	for _, h := range t.m {
		out = append(out, h)
	}
	return out
}

// size returns how many holds are registered.
func (t *holdTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// expireAt makes h end with cause ErrLost at at, when its fixed lease runs
// out, instead of whenever it was to end before: its context is cancelled
// and the Client forgets it, as the watchdog does with a hold it finds lost,
// so that a hold left to its lease (never unlocked) is not kept registered
// for as long as the Client lives. The lock expires in Redis by itself, at
// that moment or a little after (its lease was set after at was measured);
// a later Unlock answers ErrLost.
func (h *hold) expireAt(at time.Time) {
	t := &h.c.holds
	t.mu.Lock() // the timer is h.expiry before it can fire
	h.setExpiry(at)
}

// extendTo makes h end at at rather than at its current deadline, when at
// is later (a re-entry of a fixed hold WithLease); a hold that ends later
// already, or has ended, keeps its deadline.
func (h *hold) extendTo(at time.Time) {
	t := &h.c.holds
	t.mu.Lock()
	if h.expiry == nil || !at.After(h.expiry.at) {
		t.mu.Unlock()
		return
	}
	h.setExpiry(at)
}

// A deadline is when a fixed hold ends (its context cancelled with ErrLost)
// and the timer that ends it then. Only fixed holds have one, so that the
// hold itself stays small.
type deadline struct {
	timer *time.Timer
	at    time.Time
}

// Stop stops d's timer.
func (d *deadline) Stop() { d.timer.Stop() }

// setExpiry is expireAt's work; the caller holds the hold table's mutex,
// which setExpiry unlocks.
func (h *hold) setExpiry(at time.Time) {
	t := &h.c.holds
	lease := at.Sub(h.start).Round(time.Millisecond)
	d := &deadline{at: at}
	d.timer = time.AfterFunc(time.Until(at), func() {
		t.mu.Lock()
		current := h.expiry == d
		t.mu.Unlock()
		if !current {
			return // replaced by a re-entry's later deadline, or ended
		}
		cause := lostError(h.name, "its lease of "+lease.String()+" ran out")
		if t.lose(h) {
			h.end(cause)
			return
		}
		h.cancel(cause)
	})
	old := h.expiry
	h.expiry = d
	t.mu.Unlock()
	if old != nil {
		old.Stop()
	}
}

// end cancels h's context with cause.
func (h *hold) end(cause error) {
	h.c.ended(h, cause)
	h.cancel(cause)
	t := &h.c.holds
	t.mu.Lock()
	stop, expiry := h.stopLife, h.expiry
	h.stopLife, h.expiry = nil, nil
	t.mu.Unlock()
	if stop != nil {
		stop()
	}
	if expiry != nil {
		expiry.Stop()
	}
}

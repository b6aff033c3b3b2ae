package lock

import (
	"sync"
)

// A holdTable is a Client's registry of holds: which holds exist, which are
// in use by an operation, which are held, which were lost. Its mutex guards
// the fields of every hold that change outside the hold's semaphore (refs,
// pinned, lost, stopLife, expiry), which the hold's transitions alone change
// (lifecycle.go); h.sem serialises the operations on one hold, the watchdog
// owns its renewals and the wait queues (lines.qmu) its waiters.
//
// A hold is registered while an operation uses it (ref or use … unuse) or while it
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

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/lock"
)

// This file is the model the randomized test (model_test.go) checks the lock
// family against. It knows nothing of how the engine works, only what its
// contract promises:
//
//   - exclusion: an exclusive hold (Mutex, FairMutex, the locks of a
//     MultiLock, an RWMutex's write lock) has no other hold of its name
//     beside it, a read hold no write hold (but its own owner's, after a
//     downgrade), and a Semaphore no more holders than permits, unless the
//     older holder has been told: its context ended before the newer one
//     entered;
//   - a holder is told in time: within grace of another holder entering;
//     by its fixed lease's end; and, when a fault removed its hold from
//     Redis (the key deleted, a restart), within a bound after the fault;
//   - tokens: a token handed out for a name is larger than every token
//     handed out for it before (by acquisitions that returned before this
//     one started), whichever kind and path issued it.
//
// "Entered" is when Lock returned (the holder believes it holds from then
// on); a holder's belief ends when it calls its final Unlock or when its
// context ends, whichever comes first. Because a context is told by a
// goroutine of the engine and the test sees both events through the
// scheduler, every comparison of "told" with "entered" allows grace.

// A modelRole is the part a hold plays on its name.
type modelRole uint8

const (
	roleExcl   modelRole = iota // Mutex, FairMutex, MultiLock: one hash field
	roleRead                    // RWMutex read hold
	roleWrite                   // RWMutex write hold
	rolePermit                  // Semaphore permit
)

func (r modelRole) String() string {
	return [...]string{"excl", "read", "write", "permit"}[r]
}

// An mhold is one hold as the model sees it: created by a first
// acquisition, re-entered, released at its last level.
type mhold struct {
	id      int
	who     string // the goroutine that took it
	client  int
	name    string
	role    modelRole
	permits int
	via     string // the call that created it
	token   fencing.Token
	ctx     context.Context // the context whose end tells the holder

	// Guarded by model.mu.
	levels    int
	called    time.Time // the acquisition that created it was called
	entered   time.Time // ... and returned
	leaseEnd  time.Time // fixed lease: when it runs out at the latest; zero with the watchdog
	told      time.Time // ctx was seen done
	cause     error
	released  time.Time // its final Unlock was called
	doomed    time.Time // a fault removed it from Redis: must be told by then
	doomTo    time.Time // when the fault that set doomed ended
	mayDoom   time.Time // a fault may have removed it: overlaps tolerated until then
	downgrade *mhold    // the write hold of its owner this read hold was taken under
	parentEnd time.Time // the context it was taken with ended (lifetime)
}

func (h *mhold) String() string {
	return fmt.Sprintf("#%d(%s %s %s c%d %s)", h.id, h.who, h.role, h.name, h.client, h.via)
}

// end is when its holder stopped believing it holds: zero while it still does.
func (h *mhold) end() time.Time {
	switch {
	case h.told.IsZero():
		return h.released
	case h.released.IsZero() || h.told.Before(h.released):
		return h.told
	}
	return h.released
}

// untoldAt reports whether the holder still believed it held at t.
func (h *mhold) untoldAt(t time.Time) bool {
	e := h.end()
	return e.IsZero() || e.After(t)
}

// An obligation is an entry that overlapped untold holders: by each one's
// deadline, no more than allowed of them may still be untold.
type obligation struct {
	entrant   *mhold
	cands     []*mhold
	deadlines []time.Time
	allowed   int
	due       time.Time
}

// A doom is a fault that removed the holds of a name from Redis between from
// and to; holds it removed must be told within after of to.
type doom struct {
	from, to time.Time
	after    time.Duration
	why      string
}

// modelTiming is what the model allows for the engine to tell holders.
type modelTiming struct {
	grace  time.Duration // told within this of another holder entering or of a lease end
	period time.Duration // the watchdog's renewal period
	lease  time.Duration // the watchdog timeout
	slack  time.Duration // added to bounds after faults
}

// A model records what every goroutine of the test believes it holds and
// checks each step against the contract.
type model struct {
	timing modelTiming
	origin time.Time

	mu          sync.Mutex
	nextID      int
	active      map[string][]*mhold // not yet released, by name
	maxTok      map[string]fencing.Token
	dooms       map[string][]doom
	obligations []*obligation
	violations  []string
	log         []string // recent events, newest last
	logged      int
	netFaults   []window // when the network between Clients and Redis was disturbed
	stop        chan struct{}
	stopOnce    sync.Once
	counts      map[string]int
}

func newModel(timing modelTiming) *model {
	return &model{
		timing: timing,
		origin: time.Now(),
		active: make(map[string][]*mhold),
		maxTok: make(map[string]fencing.Token),
		dooms:  make(map[string][]doom),
		stop:   make(chan struct{}),
		counts: make(map[string]int),
	}
}

// at formats t as seconds since the run began.
func (m *model) at(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%.3f", t.Sub(m.origin).Seconds())
}

const modelLogLines = 6000

// logf records an event; the caller holds m.mu.
func (m *model) logf(format string, args ...any) {
	line := fmt.Sprintf("%s %s", m.at(time.Now()), fmt.Sprintf(format, args...))
	if len(m.log) >= modelLogLines {
		copy(m.log, m.log[len(m.log)/2:])
		m.log = m.log[:len(m.log)-len(m.log)/2]
	}
	m.log = append(m.log, line)
	m.logged++
}

// event is logf for callers that do not hold m.mu.
func (m *model) event(format string, args ...any) {
	m.mu.Lock()
	m.logf(format, args...)
	m.mu.Unlock()
}

// count counts an outcome for the run's summary.
func (m *model) count(what string) {
	m.mu.Lock()
	m.counts[what]++
	m.mu.Unlock()
}

// violatef records a broken promise; the caller holds m.mu. The run stops
// at its next step.
func (m *model) violatef(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	m.logf("VIOLATION %s", msg)
	m.violations = append(m.violations, msg)
	m.stopOnce.Do(func() { close(m.stop) })
}

// violation is violatef for callers that do not hold m.mu.
func (m *model) violation(format string, args ...any) {
	m.mu.Lock()
	m.violatef(format, args...)
	m.mu.Unlock()
}

// stopped reports whether a violation has stopped the run.
func (m *model) stopped() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}

// tokensBefore returns the largest token handed out for each name by
// acquisitions that have returned: the floor of a call starting now.
func (m *model) tokensBefore(names []string) []fencing.Token {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]fencing.Token, len(names))
	for i, n := range names {
		out[i] = m.maxTok[n]
	}
	return out
}

// A grant is what one successful acquisition did to one name: re-entered
// hold (when not nil) or created a new one.
type grant struct {
	name      string
	role      modelRole
	permits   int
	reenter   *mhold
	downgrade *mhold
}

// entered records a successful acquisition by who on client, called at
// called and returned at returned with ctx, and checks it. floors are
// tokensBefore's answer for the grants' names, in order; tokens reports
// whether the acquisition hands out a token for its names (a compound lock
// re-entering a hold issues one too); fixed is its lease when fixed, and
// relet says whether a re-entry's lease may extend the fixed hold it
// re-enters.
func (m *model) entered(who string, client int, via string, ctx context.Context, called, returned time.Time,
	grants []grant, floors []fencing.Token, tokens bool, fixed time.Duration, relet bool) []*mhold {
	tok, _ := fencing.FromContext(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*mhold, len(grants))
	var fresh []*mhold
	for i, g := range grants {
		if g.reenter != nil {
			g.reenter.levels++
			if fixed > 0 && relet && !g.reenter.leaseEnd.IsZero() {
				// A re-entry never weakens the hold: its lease extends a
				// fixed hold to at least its own end and does nothing to
				// a hold the watchdog renews.
				g.reenter.leaseEnd = laterOf(g.reenter.leaseEnd, returned.Add(fixed))
			}
			out[i] = g.reenter
			m.logf("%s re-enters %s with %s (levels %d) called=%s", who, g.reenter, via, g.reenter.levels, m.at(called))
			continue
		}
		m.nextID++
		h := &mhold{id: m.nextID, who: who, client: client, name: g.name, role: g.role, permits: g.permits, via: via,
			ctx: ctx, levels: 1, called: called, entered: returned, downgrade: g.downgrade}
		if tokens {
			h.token = tok
		}
		if fixed > 0 {
			// The engine counts the lease from when it sent the acquisition
			// that succeeded, at the latest when it returned.
			h.leaseEnd = returned.Add(fixed)
		}
		for _, d := range m.dooms[g.name] {
			if called.Before(d.to) && returned.After(d.from) {
				// In flight across the fault: it may have been taken before
				// and removed by it, or after it.
				h.mayDoom = laterOf(h.mayDoom, m.doomBound(h, d))
			}
		}
		m.active[g.name] = append(m.active[g.name], h)
		out[i] = h
		fresh = append(fresh, h)
		m.logf("%s takes %s token=%d called=%s", who, h, h.token, m.at(called))
	}
	if tokens {
		if tok <= 0 {
			m.violatef("%s: %s returned a context without a fencing token", who, via)
		}
		for i, g := range grants {
			if tok <= floors[i] {
				m.violatef("token went backwards: %s got token %d for %q, but %d had been handed out for it before the call (at %s)",
					who, tok, g.name, floors[i], m.at(called))
			}
			if tok > m.maxTok[g.name] {
				m.maxTok[g.name] = tok
			}
		}
	}
	for _, h := range fresh {
		m.checkEntry(h)
	}
	return out
}

// conflict reports whether holds a and b may not be held at once.
func conflict(a, b *mhold) bool {
	switch {
	case a.role == roleRead && b.role == roleRead:
		return false
	case a.downgrade == b || b.downgrade == a:
		return false
	}
	return true
}

// checkEntry checks new hold b against the holds of its name.
func (m *model) checkEntry(b *mhold) {
	var cands []*mhold
	for _, a := range m.active[b.name] {
		if a == b || !conflict(a, b) || !a.untoldAt(b.entered) {
			continue
		}
		cands = append(cands, a)
	}
	allowed := 0
	if b.role == rolePermit {
		allowed = b.permits - 1
	}
	if len(cands) > 0 {
		m.counts["beside:"+b.role.String()]++
	}
	if len(cands) <= allowed {
		return
	}
	o := &obligation{entrant: b, cands: cands, allowed: allowed}
	for _, a := range cands {
		d := b.entered.Add(m.timing.grace)
		d = laterOf(d, a.mayDoom)
		o.deadlines = append(o.deadlines, d)
		o.due = laterOf(o.due, d)
	}
	m.obligations = append(m.obligations, o)
	m.logf("%s entered beside untold %v: each must be told by %s", b, cands, m.at(o.due))
}

// doomBound is when hold h, removed from Redis by fault d, must be told.
func (m *model) doomBound(h *mhold, d doom) time.Time {
	if !h.leaseEnd.IsZero() { // nothing renews it: its own lease end tells it
		return h.leaseEnd.Add(m.timing.grace)
	}
	return d.to.Add(d.after)
}

// doom records that a fault removed the holds of names from Redis between
// from and to.
func (m *model) doom(names []string, from, to time.Time, after time.Duration, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := doom{from: from, to: to, after: after, why: why}
	for _, n := range names {
		m.dooms[n] = append(m.dooms[n], d)
		for _, h := range m.active[n] {
			b := m.doomBound(h, d)
			if h.entered.Before(from) && h.untoldAt(from) && (h.doomed.IsZero() || b.Before(h.doomed)) {
				h.doomed, h.doomTo = b, to
			}
			h.mayDoom = laterOf(h.mayDoom, b)
		}
	}
	m.logf("FAULT %s on %v from %s to %s", why, names, m.at(from), m.at(to))
}

// A window is a span of time a fault lasted; to is zero while it lasts.
type window struct{ from, to time.Time }

// netFault records that a network fault began (to zero) or ended; it
// returns the index of its window.
func (m *model) netFault(i int, at time.Time) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 {
		m.netFaults = append(m.netFaults, window{from: at})
		return len(m.netFaults) - 1
	}
	m.netFaults[i].to = at
	return i
}

// quiet reports whether no network fault touched [from, to], nor ended less
// than after before from (calls cut off by it may still be timing out).
func (m *model) quiet(from, to time.Time, after time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.quietLocked(from, to, after)
}

// quietLocked is quiet for a caller that holds m.mu.
func (m *model) quietLocked(from, to time.Time, after time.Duration) bool {
	for _, w := range m.netFaults {
		if w.from.Before(to) && (w.to.IsZero() || w.to.Add(after).After(from)) {
			return false
		}
	}
	return true
}

// levels returns h's levels.
func (m *model) levels(h *mhold) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return h.levels
}

// told records that h's context ended.
func (m *model) told(h *mhold, at time.Time, cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h.told.IsZero() {
		h.told, h.cause = at, cause
		m.logf("%s told: %v", h, cause)
	}
}

// releasing records that who called the Unlock of a level of holds.
func (m *model) releasing(who string, via string, holds []*mhold, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range holds {
		h.levels--
		if h.levels > 0 {
			m.logf("%s unlocks a level of %s with %s (levels %d)", who, h, via, h.levels)
			continue
		}
		h.released = at
		m.logf("%s releases %s with %s", who, h, via)
	}
}

// forget drops the released holds of every name from the active lists;
// the caller holds m.mu. A hold stays while an obligation may still need it.
func (m *model) forget(now time.Time) {
	keep := make(map[*mhold]bool)
	for _, o := range m.obligations {
		for _, a := range o.cands {
			keep[a] = true
		}
		keep[o.entrant] = true
	}
	for n, hs := range m.active {
		out := hs[:0]
		for _, h := range hs {
			// A released hold is still needed by entries made up to grace
			// after its release only if it was untold then; an entry checks
			// holds at its own time, so keep released ones for a while.
			if h.released.IsZero() || keep[h] || now.Sub(h.released) < 2*time.Second {
				out = append(out, h)
			}
		}
		if len(out) == 0 {
			delete(m.active, n)
		} else {
			m.active[n] = out
		}
	}
	for n, ds := range m.dooms {
		out := ds[:0]
		for _, d := range ds {
			if now.Sub(d.to) < time.Minute {
				out = append(out, d)
			}
		}
		m.dooms[n] = out
	}
}

// sweep checks the promises whose deadlines have passed by now.
func (m *model) sweep(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, hs := range m.active {
		for _, h := range hs {
			if !h.released.IsZero() || !h.told.IsZero() {
				continue
			}
			if !h.leaseEnd.IsZero() && now.After(h.leaseEnd.Add(m.timing.grace)) && h.doomed.IsZero() {
				m.violatef("%s: its fixed lease ran out at %s, and its context has not ended by %s", h, m.at(h.leaseEnd), m.at(now))
				h.told = now // once
			}
			if !h.doomed.IsZero() && now.After(h.doomed) && h.leaseEnd.IsZero() && !m.quietLocked(h.doomTo, h.doomed, 0) {
				// A network fault after the one that removed it may have
				// kept the watchdog from finding it gone; then it is told
				// when its lease ends unless renewed: a lease at most after
				// that fault, since a renewal that got through later would
				// have found it gone.
				if b := h.doomTo.Add(m.timing.lease + m.timing.slack); b.After(h.doomed) {
					m.logf("%s: a network fault after it was removed from Redis: told by its lease end, %s", h, m.at(b))
					h.doomed = b
				}
			}
			if !h.doomed.IsZero() && now.After(h.doomed) {
				m.violatef("%s: a fault removed it from Redis; its context has not ended by the bound %s (now %s)", h, m.at(h.doomed), m.at(now))
				h.told = now
			}
		}
	}
	out := m.obligations[:0]
	for _, o := range m.obligations {
		if now.Before(o.due) {
			out = append(out, o)
			continue
		}
		var untold []string
		for i, a := range o.cands {
			if a.untoldAt(o.deadlines[i]) {
				untold = append(untold, fmt.Sprintf("%s (entered %s, deadline %s, end %s, cause %v)",
					a, m.at(a.entered), m.at(o.deadlines[i]), m.at(a.end()), a.cause))
			}
		}
		if len(untold) > o.allowed {
			what := "exclusion"
			if o.entrant.role == rolePermit {
				what = fmt.Sprintf("semaphore of %d permits", o.entrant.permits)
			}
			m.violatef("%s broken: %s entered at %s (called %s, token %d) while %d holder(s) were not told in time: %s",
				what, o.entrant, m.at(o.entrant.entered), m.at(o.entrant.called), o.entrant.token, len(untold), strings.Join(untold, "; "))
		}
	}
	m.obligations = out
	m.forget(now)
}

// pending reports whether obligations are still to be checked.
func (m *model) pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.obligations) > 0
}

// unreleased returns the holds not yet released.
func (m *model) unreleased() []*mhold {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*mhold
	for _, hs := range m.active {
		for _, h := range hs {
			if h.released.IsZero() {
				out = append(out, h)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// report returns the violations and the log lines that explain them: the
// last ones overall and the last ones about each name involved.
func (m *model) report(names []string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, v := range m.violations {
		fmt.Fprintf(&b, "VIOLATION: %s\n", v)
	}
	tail := func(title string, match func(string) bool, n int) {
		var lines []string
		for i := len(m.log) - 1; i >= 0 && len(lines) < n; i-- {
			if match(m.log[i]) {
				lines = append(lines, m.log[i])
			}
		}
		fmt.Fprintf(&b, "--- %s (last %d) ---\n", title, len(lines))
		for i := len(lines) - 1; i >= 0; i-- {
			b.WriteString(lines[i])
			b.WriteByte('\n')
		}
	}
	for _, n := range names {
		mentioned := false
		for _, v := range m.violations {
			if strings.Contains(v, " "+n+" ") || strings.Contains(v, "\""+n+"\"") {
				mentioned = true
			}
		}
		if mentioned {
			tail("events of "+n, func(l string) bool {
				return strings.Contains(l, " "+n+" ") || strings.Contains(l, n+"]") || strings.Contains(l, "FAULT")
			}, 80)
		}
	}
	tail("last events", func(string) bool { return true }, 60)
	return b.String()
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlierOf(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// errorClass sorts an error of a lock operation into what the model
// accepts: a sentinel of package lock, the caller's context, or trouble on
// the way to Redis. Anything else is "unexpected".
func errorClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lock.ErrUpgrade):
		return "upgrade"
	case errors.Is(err, lock.ErrNotAcquired):
		return "busy"
	case errors.Is(err, lock.ErrNotHeld):
		return "not-held"
	case errors.Is(err, lock.ErrLost):
		return "lost"
	case errors.Is(err, lock.ErrReleased): // a re-entry of a hold released a moment ago
		return "released"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "ctx"
	case errors.Is(err, lock.ErrClosed), errors.Is(err, lock.ErrInvalid):
		return "unexpected"
	}
	s := err.Error()
	for _, net := range []string{"connection reset", "broken pipe", "EOF", "i/o timeout", "connection refused",
		"use of closed network connection", "LOADING", "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK ", "pool timeout",
		"context deadline exceeded", "no route"} {
		if strings.Contains(s, net) {
			return "net"
		}
	}
	return "unexpected"
}

package lock

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/seckillguard/seckillguard/fencing"
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
	// permit is the owner's member of a Semaphore's permits handed out
	// ("{<name>}:timeout", see permitlib.lua).
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
	attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error)
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
	renewal(h *hold) (*script, []string, []any)
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
	c        *engine
	id       holdID
	hk       any    // the context key that carries the hold (see heldKey)
	name     string // as the caller wrote it, for errors
	field    string // the owner's field or member in Redis
	fieldBox [1]any // {field}: field boxed once, for the script arguments of every call and the renewal's list
	// field's bytes: written once, when the hold is made, and never again
	fieldBytes [fieldSize]byte

	// sem serialises the acquisitions and releases of this hold, so that the
	// hold count sent to Redis is always the one this process last saw.
	sem holdSem

	// Guarded by sem.
	kind   kind
	levels int
	token  fencing.Token
	top    fencing.Token // the last token reserved for this hold's run of handovers (see tokenBlock); <= token when none is
	lease  time.Duration // lease of every acquisition and renewal
	relet  time.Duration // the lease a re-entry of a fixed hold under way extends it to (WithLease), 0 when none
	start  time.Time     // when the first acquisition, or the handover to this hold, was sent
	ack    replicaAck    // replicas that must confirm the first acquisition
	argv   [9]any        // the command of a Mutex's acquisition or release in Redis (see script.runIn)
	// The flags side by side, in one word (a hold's size decides its
	// allocation's: every first acquisition makes one).
	fixed    bool // WithLease: no watchdog
	unsure   bool // a release failed with an unknown outcome
	retrying bool // a final release failed; releaseLater retries it
	queued   bool // the owner has a place in a wait line in Redis (kept alive by waiting)
	ended    bool // released because the context it was taken with ended: a later Unlock returns nil
	handed   bool // handed over: the watchdog renews it since the handover (see handOff), until establish adopts it
	// released by the retries in the background after its final Unlock
	// failed (see releaseLater): the caller's own retry returns nil
	releasedLater bool
	// retry counts the background retries of a failed final release
	// started, and the re-entries that stopped one: a retry goes on only
	// while it is the current one (see releaseLater)
	retry uint8

	// Set once at the first acquisition, before the hold is published.
	parent context.Context // what ctx descends from: the context the hold was taken with
	ctx    context.Context
	cancel context.CancelCauseFunc

	reported atomic.Bool // its end was told to the Observer

	// Parts of ctx and of its cause kept in the hold, so that an
	// acquisition allocates them with the hold: each is set once.
	carrier  holdContext
	tokenCtx fencing.TokenContext // the carrier with the token, for kinds that issue one
	detached detachedContext      // the carrier's context without its cancellation (see detach)
	released nameError

	// Guarded by the Client's holdTable's mutex; changed by the transitions
	// of lifecycle.go alone.
	refs     int  // operations in progress on this hold
	pinned   bool // held: stays registered until released or lost
	lost     bool
	stopLife func() bool // stops the release that parent's end would trigger (see establish)
	expiry   *fixedEnd   // ends ctx when a fixed lease runs out; nil without one

	// inflight is the handover that made the hold, while it may still be
	// on its way to Redis (see handOverAhead); nil otherwise.
	inflight atomic.Pointer[inflightHandover]

	renewal renewal // how the watchdog renews the hold
	// waiting is how the watchdog keeps the owner's place in a wait line
	// alive: allocated by the first attempt that leaves the owner in line
	// (only the kinds with a line in Redis do), nil until then.
	waiting *renewal
}

// A detachedContext is a hold's context without its cancellation, as
// context.WithoutCancel makes it: the context a release is sent with, which
// must run whatever happened to the context it was called with. A hold
// keeps the one of its first context (see detach).
type detachedContext struct {
	context.Context                 // the hold's context
	inner           context.Context // its cancellation, which it hides
}

func (d *detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d *detachedContext) Done() <-chan struct{}       { return nil }
func (d *detachedContext) Err() error                  { return nil }

// Value is the hold context's, but for the key under which the context
// package finds a context's cancellation, the one key whose value is the
// hold's inner context itself: context.Cause then answers nil, as for a
// context of context.WithoutCancel.
func (d *detachedContext) Value(key any) any {
	if v := d.Context.Value(key); v != any(d.inner) {
		return v
	}
	return nil
}

func (d *detachedContext) String() string { return contextName(d.Context) + ".WithoutCancel" }

// detach returns ctx without its cancellation, as context.WithoutCancel
// does, allocating nothing when ctx is h's first context, the one Lock
// returned.
func (h *hold) detach(ctx context.Context) context.Context {
	if ctx == h.detached.Context && ctx != nil {
		return &h.detached
	}
	return context.WithoutCancel(ctx)
}

// A holdContext is a hold's context: the hold's cancellation, carrying the
// hold under its context key (see heldKey), as context.WithValue would.
type holdContext struct {
	context.Context
	h *hold
}

func (c *holdContext) Value(key any) any {
	if key == c.h.hk {
		return c.h
	}
	return c.Context.Value(key)
}

func (c *holdContext) String() string {
	return contextName(c.Context) + ".WithValue(lock " + c.h.name + ")"
}

// contextName describes ctx as the context package does.
func contextName(ctx context.Context) string {
	if s, ok := ctx.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", ctx)
}

// heldKey is the context key under which a hold's context, and every context
// derived from it, carries the hold: how a later acquisition of the same lock
// with such a context finds the hold it re-enters. Ownership is per hold: a
// context that carries no hold of a lock acquires it afresh, under an owner
// id of its own, whatever other locks of the Client it holds. Each lock value
// boxes its key once (see holdKey), so that looking it up allocates nothing.
type heldKey struct {
	c   *engine
	key string
	r   role
}

// holdKey returns the context key of the holds of role r on key, boxed.
func (c *engine) holdKey(key string, r role) any { return heldKey{c, key, r} }

// fieldSize is the length of the longest field: a UUID, ':', an int64 and
// ":write".
const fieldSize = 36 + 1 + 19 + len(":write")

// field returns the lock-hash field of owner in role r:
// "<clientUUID>:<ownerID>", and "<clientUUID>:<ownerID>:write" for a
// writer. It writes it in buf, the hold's, and returns buf's bytes as the
// string, without a copy: the caller never writes buf again, so the string
// never changes (a field that did not fit, which a Client's UUID rules out,
// is in an array of its own).
func (c *link) field(buf *[fieldSize]byte, owner int64, r role) string {
	b := append(buf[:0], c.id...)
	b = strconv.AppendInt(append(b, ':'), owner, 10)
	if r == writer {
		b = append(b, ":write"...)
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// heldBy returns the hold ctx descends from under the context key hk (see
// holdKey), or nil.
func heldBy(ctx context.Context, hk any) *hold {
	h, _ := ctx.Value(hk).(*hold)
	return h
}

// A fixedEnd is when a fixed hold ends (its context cancelled with ErrLost)
// and the timer that ends it then. Only fixed holds have one, so that the
// hold itself stays small.
type fixedEnd struct {
	timer *time.Timer
	at    time.Time
}

// Stop stops d's timer.
func (d *fixedEnd) Stop() { d.timer.Stop() }

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

// setExpiry is expireAt's work; the caller holds the hold table's mutex,
// which setExpiry unlocks.
func (h *hold) setExpiry(at time.Time) {
	t := &h.c.holds
	lease := at.Sub(h.start).Round(time.Millisecond)
	d := &fixedEnd{at: at}
	d.timer = time.AfterFunc(time.Until(at), func() {
		t.mu.Lock()
		current := h.expiry == d
		t.mu.Unlock()
		if !current {
			return // replaced by a re-entry's later deadline, or ended
		}
		cause := lostError(h.name, "its lease of "+lease.String()+" ran out")
		if h.lose() {
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

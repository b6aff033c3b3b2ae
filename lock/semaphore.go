package lock

import (
	"context"
	"fmt"
	"time"
)

// semChannelPrefix is Redisson's prefix for a semaphore's channel.
const semChannelPrefix = "redisson_sc"

// A Semaphore limits how many owners across every Client hold it at once:
// "at most 50 concurrent checkouts per SKU". Each holder has a permit with a
// lease of its own, renewed by the watchdog while held (or fixed with
// WithLease); the permit of a holder that died returns by itself when its
// lease ends, at most the watchdog timeout later, never stuck as a
// Redisson RSemaphore's would be.
//
// Its keys are Redisson's RPermitExpirableSemaphore's, with their meaning, so
// a Java service on Redisson that takes permits of the
// RPermitExpirableSemaphore of the same name counts against the same limit:
// the name holds the count of free permits, "{<name>}:timeout" each permit
// handed out and when its lease ends (ours under "<clientUUID>:<ownerID>"),
// and releases announce the free count on "redisson_sc:{<name>}". The first
// Semaphore call on a name without a count sets it, as Redisson's
// trySetPermits would, and gives it an expiry so that names made per request
// leave nothing behind: it lasts one lease past the latest lease of a permit
// of this package. A count that Redisson's trySetPermits set has no expiry
// and keeps none.
//
// A permit is reentrant through the context Acquire returns: acquiring again
// with it takes no second permit, and each Acquire needs its own Release.
// Ownership is per hold: goroutines that share a request context but not the
// permit's own context take a permit each. It
// carries no fencing token (its holders are not exclusive); the context keeps
// the token of any exclusive lock it descends from.
//
// The number of permits is stored in Redis (free permits plus those handed
// out), as Redisson stores it, and every Semaphore of one name must be made
// with that number: an acquisition by a Semaphore of another number fails
// with an error matching ErrInvalid that names both, and takes nothing. To
// change the limit, change it in Redis (Redisson's setPermits) as the
// instances with the new number start.
//
// A Semaphore does no I/O until used and may be copied freely.
type Semaphore struct {
	handle
	key     string
	permits int
	keys    []string // free permits' counter, permits handed out, channel
	mark    string   // the channel's mark (see markChannel)
	hk      any      // the context key of its permits (see heldKey)
}

// newSemaphore returns the Semaphore of the engine c (nil: of a nil Client): see
// Client.Semaphore.
func newSemaphore(c *engine, name string, permits int) *Semaphore {
	s := &Semaphore{handle: handle{c: c, name: name, given: name}, permits: permits}
	switch {
	case c == nil:
		s.checkErr = fmt.Errorf("%w: nil lock client", ErrInvalid)
	case permits < 1:
		s.checkErr = fmt.Errorf("%w: %d permits, want at least 1", ErrInvalid, permits)
	default:
		if s.checkErr = checkName(name); s.checkErr == nil {
			s.key = c.key(name)
			s.name = s.key
			if s.checkErr = checkName(s.key); s.checkErr == nil {
				s.keys = []string{s.key, permitsKey(s.key), derived(semChannelPrefix, s.key)}
				s.mark = markChannel(s.keys[2], c.cluster)
				s.hk = c.holdKey(s.key, permit)
			}
		}
	}
	return s
}

// permitsKey returns the key of the permits handed out by the semaphore key,
// as Redisson names it: "{<key>}:timeout", or "<key>:timeout" when key holds
// a "{" (see timeoutBase).
func permitsKey(key string) string { return timeoutBase(key) + ":timeout" }

// Name returns the semaphore's name as given to Client.Semaphore.
func (s *Semaphore) Name() string {
	if s == nil {
		return ""
	}
	return s.given
}

// Permits returns how many holders the semaphore admits at once.
func (s *Semaphore) Permits() int {
	if s == nil {
		return 0
	}
	return s.permits
}

func (s *Semaphore) usable() error {
	if s == nil {
		return fmt.Errorf("%w: nil semaphore", ErrInvalid)
	}
	return s.handle.usable()
}

// Acquire takes a permit, waiting as long as it takes or until ctx ends, and
// returns the context that holds it: it is cancelled with cause ErrLost if
// the permit is lost while held. If ctx holds a permit of this semaphore
// already (it descends from an Acquire of it), Acquire re-enters it at once.
// The permit never outlives ctx: when ctx ends it is given back as Release
// would, and a Release that comes later returns nil.
func (s *Semaphore) Acquire(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return s.acquire(ctx, -1, opts)
}

// TryAcquire is Acquire with a bounded wait: it gives up after wait with
// ErrNotAcquired. wait 0 makes exactly one attempt; a negative wait is an
// error (ErrInvalid).
func (s *Semaphore) TryAcquire(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(s.Name(), wait); err != nil {
		return ctx, err
	}
	return s.acquire(ctx, wait, opts)
}

func (s *Semaphore) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := s.usable(); err != nil {
		return ctx, err
	}
	return s.c.acquire(ctx, s, s.key, permit, s.hk, s.name, wait, opts)
}

// Release releases one level of the permit held by ctx; the last level gives
// the permit back and wakes a waiter. It returns ErrNotHeld when ctx holds
// no permit and an error matching ErrLost when the permit was lost.
func (s *Semaphore) Release(ctx context.Context) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.c.unlock(ctx, s.hk, s.name)
}

// The Semaphore is the kind of its permits.

func (s *Semaphore) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	lease, _ := s.c.leaseArgs(h)
	r, err := readPair(permitAcquireScript.run(ctx, via, s.keys, lease, h.field, 0, s.permits, s.c.publish, s.c.leaseMS))
	if err != nil {
		return false, 0, err
	}
	switch {
	case r.is(1):
		return true, 0, nil
	case r.is(0):
		return false, retryAfter(s.c.link, r.value), nil
	case r.is(-2):
		return false, 0, fmt.Errorf("%w: Redis holds %d permits for this semaphore (free and handed out), this Semaphore was made with %d"+
			" (a Redisson RSemaphore's permits are not counted as handed out: share the name with an RPermitExpirableSemaphore)", ErrInvalid, r.value, s.permits)
	}
	return false, 0, r.unexpected("permit acquire")
}

func (s *Semaphore) reenter(ctx context.Context, h *hold) (bool, error) {
	_, lease := s.c.leaseArgs(h)
	r, err := readPair(s.c.run(ctx, permitAcquireScript, s.keys, lease, h.field, h.levels, s.permits, s.c.publish, s.c.leaseMS))
	if err != nil {
		return false, err
	}
	return r.is(1), nil
}

func (s *Semaphore) release(ctx context.Context, h *hold) (int64, error) {
	if h.levels > 1 {
		return int64(h.levels - 1), nil // Redis knows the permit, not its levels
	}
	r, err := readPair(s.c.run(ctx, permitReleaseScript, s.keys, h.field, s.c.publish, s.mark, s.c.numsub()))
	switch {
	case err != nil:
		return 0, err
	case r.is(-1):
		return -1, nil
	case !r.is(0):
		return 0, r.unexpected("permit release")
	}
	// Redisson's waiters, woken by the count just announced, need longer
	// than this Client's next attempt to take the permit: they get turns
	// (see permitTurn).
	s.c.permitGiven(s.keys[2], r.value, time.Now())
	return 0, nil
}

func (s *Semaphore) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired {
		return
	}
	if err := s.c.run(ctx, permitReleaseScript, s.keys, h.field, s.c.publish, s.mark, s.c.numsub()).Err(); err != nil {
		s.c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not roll back a permit of unknown outcome; it expires with its lease",
			"semaphore", s.name, "lease", h.lease, "err", err)
	}
}

func (s *Semaphore) renewal(h *hold) (*script, []string, []any) {
	return permitRenewScript, s.keys[:2], []any{h.field}
}

func (s *Semaphore) channel(*hold) string { return s.keys[2] }
func (s *Semaphore) shared() bool         { return true }
func (s *Semaphore) tokens() bool         { return false }

// observedAs names a permit to the Observer (see kindOf).
func (*Semaphore) observedAs() (Kind, string) { return KindSemaphore, "" }

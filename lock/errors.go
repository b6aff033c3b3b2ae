package lock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/ctxend"
)

var (
	// ErrNotAcquired is returned by TryLock when the lock is still held by
	// another owner after the wait. It is never returned for a caller whose
	// context ended: that caller gets the context's error.
	ErrNotAcquired error = &refusal{"lock: not acquired"}

	// ErrNotHeld is returned by Unlock when the context does not hold the lock.
	ErrNotHeld = errors.New("lock: not held")

	// ErrLost is the cause with which a lock's context is cancelled when the
	// lock is found gone while it was held (expired lease, a failover, a
	// ForceUnlock, the Client closed), and the error Unlock returns for such a
	// hold. Work done under a lost lock may have overlapped another holder's.
	ErrLost = errors.New("lock: lost")

	// ErrReleased is the cause with which a lock's context is cancelled after
	// its final Unlock.
	ErrReleased = errors.New("lock: released")

	// ErrClosed is returned by every operation of a closed Client.
	ErrClosed error = &refusal{"lock: client closed"}

	// ErrUpgrade is returned by RWMutex.Lock when the context holds the read
	// lock: waiting for the write lock would wait for itself. Release the
	// read lock first (or take the write lock first and the read lock
	// under it, which is allowed).
	ErrUpgrade error = &refusal{"lock: read lock held; upgrade to the write lock would deadlock"}

	// ErrNotReplicated is returned when an acquisition made with replica
	// acknowledgement (WithReplicaAck, WithReplicas) was confirmed by fewer
	// replicas than required within the timeout. The acquisition has been
	// undone.
	ErrNotReplicated error = &refusal{"lock: not confirmed by enough replicas"}

	// ErrNoQuorum is returned by a RedLock when fewer than a majority of its
	// nodes could be reached, and is the cause of a RedLock context whose
	// majority was lost (it then wraps ErrLost too).
	ErrNoQuorum error = &refusal{"lock: no quorum"}

	// ErrInvalid reports bad input: a nil Redis client or context, an empty
	// or malformed lock name, a negative wait, a lease or timeout that is not
	// positive, a name whose keys in Redis hold another kind of lock or
	// object (a Semaphore on a Redisson RSemaphore's name, say: the error
	// keeps Redis's WRONGTYPE reply as its cause).
	ErrInvalid error = &refusal{"lock: invalid argument"}

	// ErrUnavailable reports a Redis that could not be reached or could not
	// serve the call (a refused or broken connection, a timeout, a node that
	// is loading, read-only or without its Cluster slots): an outage, not
	// contention. The error keeps its cause, so errors.Is matches both
	// ErrUnavailable and, say, a *net.OpError or context.DeadlineExceeded of
	// go-redis's read timeout. A caller whose own context ended gets that
	// context's error instead.
	ErrUnavailable = errors.New("lock: redis unavailable")
)

// wrap adds the lock's name to err: `lock "ns:sku:42": not acquired`. name
// is the lock's full Redis name, the Client's namespace included.
func wrap(name string, err error) error {
	return &nameError{name: name, err: err}
}

// nameError is err in the lock called name. It formats only when asked:
// wrap runs on every release (the cause of the released context).
type nameError struct {
	name string
	err  error
}

func (e *nameError) Error() string { return "lock " + strconv.Quote(e.name) + ": " + text(e.err) }
func (e *nameError) Unwrap() error { return e.err }

// text is err's message without the package's "lock: " in front, for an
// error that follows a lock's name or another error of the package.
func text(err error) string {
	return strings.TrimPrefix(err.Error(), "lock: ")
}

// chain is err because of cause: its message reads "err: cause" without a
// second "lock: ", and errors.Is and errors.As find both.
type chain struct{ err, cause error }

func (e *chain) Error() string   { return e.err.Error() + ": " + text(e.cause) }
func (e *chain) Unwrap() []error { return []error{e.err, e.cause} }

// because returns err with cause kept beside it (see chain).
func because(err, cause error) error { return &chain{err: err, cause: cause} }

// unavailable returns err, a failure of a Redis call, as an outage that
// matches ErrUnavailable with err as its cause, when it is one: anything but
// an error of this package, the end of the caller's context and an error
// reply of the server other than one that says it cannot serve now
// (LOADING, READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY). A reply
// that a key holds another type of value is returned as errOtherKind with
// the reply as its cause; other error replies (a script error) are returned
// as they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) || ours(err) {
		return err
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		switch msg := reply.Error(); {
		case strings.Contains(msg, "WRONGTYPE"):
			return because(errOtherKind, err)
		case !unservable(msg):
			return err
		}
	}
	return &outage{cause: err}
}

// errOtherKind is the error of a call on a name whose keys hold the data of
// another kind: two kinds of this package, or one of ours and a Redisson
// object whose keys differ (an RSemaphore's counter, say), use one name.
var errOtherKind = fmt.Errorf("%w: the name's keys hold a lock or object of another type (two types share the name)", ErrInvalid)

// An outage is a Redis call's failure err that matches ErrUnavailable.
type outage struct{ cause error }

func (e *outage) Error() string   { return text(ErrUnavailable) + ": " + e.cause.Error() }
func (e *outage) Unwrap() []error { return []error{ErrUnavailable, e.cause} }

// noted is err with what failed in front: "unlock: not held", without the
// package's "lock: " in the middle.
func noted(what string, err error) error { return &note{what: what, err: err} }

type note struct {
	what string
	err  error
}

func (e *note) Error() string { return e.what + ": " + text(e.err) }
func (e *note) Unwrap() error { return e.err }

// unservable reports whether a Redis error reply says the server cannot
// serve the call now, rather than that the call was wrong.
func unservable(msg string) bool {
	for _, p := range [...]string{"LOADING ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "BUSY ", "NOREPLICAS "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// ours reports whether err is, or wraps, a sentinel of this package.
func ours(err error) bool {
	var no *refusal
	return errors.As(err, &no) || errors.Is(err, ErrLost) || errors.Is(err, ErrReleased) || errors.Is(err, ErrNotHeld)
}

// noContext is the error of an operation on the lock called name that was
// given a nil context: bad input, never a panic.
func noContext(name string) error {
	return wrap(name, errNilContext)
}

var errNilContext = fmt.Errorf("%w: nil context", ErrInvalid)

// ctxErr reports why ctx ended. errors.Is(err, context.Canceled) and
// errors.Is(err, context.DeadlineExceeded) keep working, and a custom cause
// (context.WithCancelCause) is kept beside it.
func ctxErr(name string, ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return wrap(name, err)
	}
	return wrap(name, because(err, cause))
}

// acquireErr is the error an acquisition of the lock called name reports
// for err, the outcome of its steps as it came: err itself when it is a
// lock's error already (a hold found lost or released, which names its
// lock), or else failed's.
func acquireErr(ctx context.Context, name string, err error) error {
	var named *nameError
	if err == nil || errors.As(err, &named) {
		return err
	}
	return failed(ctx, name, err)
}

// notAcquired is the error of a wait that ran out: ErrNotAcquired, unless
// the caller's context ended too — a caller that gave up is never told the
// lock was busy.
func notAcquired(ctx context.Context, name string) error {
	return failed(ctx, name, ErrNotAcquired)
}

// failed is the error of an operation on the lock called name that failed
// with err: the caller's context's end when it has ended (the failure is
// most likely its consequence), err otherwise.
func failed(ctx context.Context, name string, err error) error {
	if ctxend.Ended(ctx) {
		return ctxErr(name, ctx)
	}
	return wrap(name, unavailable(err))
}

// lostError is the cause of a lost hold's context.
func lostError(name, why string) error {
	return wrap(name, fmt.Errorf("%w: %s", ErrLost, why))
}

// closedError is the cause of a hold of the lock called name that its
// Client's Close ended.
func closedError(name string) error {
	return wrap(name, because(ErrLost, ErrClosed))
}

// outcomeUnknown reports whether a command that failed with err may have been
// executed: anything but an error reply from the server, a connection that
// was never obtained, or a refusal of this package (see refusal).
func outcomeUnknown(err error) bool {
	var reply redis.Error
	if errors.As(err, &reply) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var no *refusal
	if errors.As(err, &no) {
		return false
	}
	return !errors.Is(err, redis.ErrClosed) && !errors.Is(err, redis.ErrPoolTimeout)
}

// A refusal is a sentinel error of this package that means the operation
// was not carried out: bad input, a closed Client, a wait that ran out, too
// few replicas or nodes (whose acquisition was undone). An error that wraps
// one leaves nothing behind in Redis that needs undoing, so outcomeUnknown
// answers false for it. ErrLost and ErrReleased are not refusals: they
// report what happened to a hold.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }

package lock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// DefaultWatchdogTimeout is the lease of a lock held without WithLease. The
// watchdog renews such a lock every third of it while the lock is held, so a
// holder that dies keeps it at most this long. Redisson uses the same default.
const DefaultWatchdogTimeout = 30 * time.Second

// An Option configures a Client.
type Option func(*clientOptions)

type clientOptions struct {
	watchdogTimeout time.Duration
	fairWait        time.Duration // a fair waiter's wait when it gives none (WithFairLockWaitTimeout)
	tokenExpiry     time.Duration // 0: token counters never expire
	namespace       string
	logger          *slog.Logger
	ack             replicaAck // default for every acquisition
	observer        Observer   // nil: none
	err             error
}

func defaultClientOptions() clientOptions {
	return clientOptions{watchdogTimeout: DefaultWatchdogTimeout, fairWait: DefaultFairLockWaitTimeout, tokenExpiry: DefaultTokenExpiry, logger: slog.Default()}
}

// WithWatchdogTimeout sets the lease of locks held without WithLease; the
// watchdog renews them every d/3. Default DefaultWatchdogTimeout (30s).
// A shorter timeout frees the locks of a crashed holder sooner and costs more
// renewals; d must be at least 30ms.
func WithWatchdogTimeout(d time.Duration) Option {
	return func(o *clientOptions) {
		if d < 30*time.Millisecond {
			o.err = fmt.Errorf("%w: watchdog timeout %v, want at least 30ms", ErrInvalid, d)
			return
		}
		o.watchdogTimeout = d
	}
}

// DefaultFairLockWaitTimeout is the wait a FairMutex waiter's place in line
// is counted with when it gives none: Redisson's default fairLockWaitTimeout.
const DefaultFairLockWaitTimeout = 5 * time.Minute

// WithFairLockWaitTimeout sets the wait a FairMutex waiter's place in line
// is counted with when it gives none (Lock, and TryLock with wait 0; a
// TryLock with a positive wait counts with that wait), as Redisson's
// fairLockWaitTimeout does for RFairLock: the line is Redisson's, and a
// place's deadline in it is the deadline of the waiter ahead (or, first in
// an empty line, the holder's lease end) plus the waiter's wait; each
// acquisition lowers every deadline left by the taker's wait, and a waiter
// that gives up lowers those behind it by its own. A first waiter whose
// deadline passes is dropped as stale by the next attempt or unlock on
// either side (its owner, if alive, queues again at the end of the line),
// and a dead Java waiter holds the line until its deadline. Every taker
// lowers the others by the wait its own deadline was raised with, so the
// line stays consistent whatever each side's value; set d to the Java
// services' fairLockWaitTimeout so that a Go and a Java waiter keep their
// places equally long. Default DefaultFairLockWaitTimeout (5 minutes),
// Redisson's default. d must be at least a millisecond.
//
// This is not how long a waiter of this package may stay silent: that is
// its liveness, kept in a key Redisson never reads and renewed by the
// watchdog, and a waiter of this package that died is given up one
// watchdog timeout (WithWatchdogTimeout) after its last renewal.
func WithFairLockWaitTimeout(d time.Duration) Option {
	return func(o *clientOptions) {
		if d < time.Millisecond {
			o.err = fmt.Errorf("%w: fair lock wait timeout %v, want at least 1ms", ErrInvalid, d)
			return
		}
		o.fairWait = d
	}
}

// DefaultTokenExpiry is how long a lock name's fencing token counter
// ("redisson_lock_token:{<name>}") survives at least without an acquisition
// that issues a token from it (and at most an eighth longer: see
// WithTokenExpiry).
const DefaultTokenExpiry = 24 * time.Hour

// WithTokenExpiry sets how long a lock name's fencing token counter survives
// at least without an acquisition: it ends between d and d + d/8 after the
// last acquisition that issued a token from it (or raised it: MultiLock,
// RedLock). Acquisitions keep the counter's expiry as it is, which costs
// Redis less than setting it, except the first of every eighth of d, which
// sets it to d + d/8. Default DefaultTokenExpiry (24h). The expiry keeps
// names made from requests ("sku:<sku>" with made-up SKUs) from growing
// Redis without bound, and it cannot make tokens go backwards: tokens
// follow the Redis clock (max(stored+1, TIME in µs)), so the first token
// after an expiry is the clock again, above every token issued before
// unless the server's clock went back by more than d.
//
// 0 keeps counters forever, as Redisson does. Use it for names a Java
// service locks with Redisson's RFencedLock: it INCRs the same counter, and
// after an expiry its INCR would restart at 1, below the tokens issued
// before (this package's next token is the clock again either way). d must
// be 0 or at least a minute.
func WithTokenExpiry(d time.Duration) Option {
	return func(o *clientOptions) {
		if d != 0 && d < time.Minute {
			o.err = fmt.Errorf("%w: token expiry %v, want 0 (never) or at least a minute", ErrInvalid, d)
			return
		}
		o.tokenExpiry = d
	}
}

// WithNamespace prefixes every lock name with ns and a colon ("ns:name")
// before anything is derived from it, so that two services (or staging and
// production) on one Redis never share a lock: the lock hash is "ns:sku:42",
// its channel "redisson_lock__channel:{ns:sku:42}", its token counter
// "redisson_lock_token:{ns:sku:42}". A Redisson client whose NameMapper adds
// the same "ns:" prefix locks the same names. ns may not contain "{" or "}"
// (they would move the lock's keys to another Cluster slot than its derived
// ones). Default: no prefix, so names are the Redis keys themselves, as in
// Redisson.
func WithNamespace(ns string) Option {
	return func(o *clientOptions) {
		if strings.ContainsAny(ns, "{}") {
			o.err = fmt.Errorf("%w: namespace %q contains a brace; a namespace may not contain \"{\" or \"}\"", ErrInvalid, ns)
			return
		}
		o.namespace = ns
	}
}

// WithLogger sets where the Client reports background trouble: holds lost,
// releases and rollbacks that fail, subscriptions that break. A record about
// a hold is written with the context the hold was taken with (slog's
// *Context forms), even when the watchdog or a retry writes it long after
// Lock returned, so a handler can add the request's trace and request ids;
// records about the Client's pub/sub connections, which serve many requests,
// get context.Background(). Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *clientOptions) {
		if l != nil {
			o.logger = l
		}
	}
}

// A LockOption configures one acquisition.
type LockOption func(*lockOptions)

type lockOptions struct {
	lease time.Duration // 0 = watchdog
	ack   replicaAck
	err   error
}

// WithLease holds the lock for exactly d unless it is unlocked sooner, and
// turns the watchdog off for this hold: nothing renews it. The returned
// context is cancelled with cause ErrLost when the lease runs out, so work
// that outlives the lease learns it at once. Default: no fixed lease; the
// watchdog renews the lock while it is held. d must be positive.
//
// A re-entry (a Lock with a context that holds the lock already) never
// weakens the hold it enters: it never shortens its lease and never turns
// its watchdog off, so an inner function cannot take the watchdog away from
// its caller. WithLease on a re-entry extends a fixed hold to at least d from
// this call (its context then ends at the later of its deadline and that
// one) and does nothing to a hold the watchdog renews. A re-entry without
// WithLease leaves the hold as it is: a fixed lease keeps its deadline, a
// renewed hold stays renewed. Redisson differs: its RLock re-entry with a
// lease sets the lock's expiry to the new lease (shorter or not, and a
// re-entry without one puts a leased hold under the watchdog), and its write
// lock's re-entry adds the new lease to what is left. MultiLock and RedLock
// re-entries keep their leases. A downgrade (RWMutex.RLock with the write
// lock's context) is not a re-entry: its read hold has a lease of its own.
//
// A fixed lease is the classic trap of Redis locks: work that takes longer
// than d runs unprotected. Prefer the watchdog, and fence the writes.
func WithLease(d time.Duration) LockOption {
	return func(o *lockOptions) {
		if d < time.Millisecond {
			// Redis counts leases in whole milliseconds: less is no lease at all.
			o.err = fmt.Errorf("%w: lease %v, want at least 1ms", ErrInvalid, d)
			return
		}
		o.lease = d
	}
}

// WithObserver adds o to the Client's Observers: each is told of every
// Event, in the order their options were given (a Guard's metrics and a
// tracer, say). A nil o adds nothing. Default: none.
func WithObserver(o Observer) Option {
	return func(opts *clientOptions) {
		switch prev := opts.observer; {
		case o == nil:
		case prev == nil:
			opts.observer = o
		default:
			opts.observer = func(e Event) { prev(e); o(e) }
		}
	}
}

// WithReplicaAck makes every first acquisition by the Client wait until
// replicas replicas have confirmed it (Redis WAIT), for at most timeout. An
// acquisition that fewer replicas confirm is undone and fails with
// ErrNotReplicated, so a lock is never held on the master alone where a
// failover would lose it. Re-entries, renewals and releases do not wait.
// Default: 0 replicas, no acknowledgement; WithReplicas overrides it for one
// acquisition.
//
// Redisson's equivalent fails only when no replica at all confirms; here the
// number is yours. Acknowledgement narrows the failover window, it does not
// close it: a replica that confirmed may still not be the one promoted. Fence
// the writes.
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(o *clientOptions) {
		ack, err := newReplicaAck(replicas, timeout)
		if err != nil {
			o.err = err
			return
		}
		o.ack = ack
	}
}

// WithReplicas is WithReplicaAck for one acquisition: it waits until replicas
// replicas have confirmed it, for at most timeout, and fails with
// ErrNotReplicated (having undone the acquisition) when fewer do. replicas 0
// turns a Client's default acknowledgement off. Default: the Client's
// WithReplicaAck setting.
func WithReplicas(replicas int, timeout time.Duration) LockOption {
	return func(o *lockOptions) {
		ack, err := newReplicaAck(replicas, timeout)
		if err != nil {
			o.err = err
			return
		}
		o.ack = ack
	}
}

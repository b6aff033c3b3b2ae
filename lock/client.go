// Package lock provides distributed locks on Redis in the layout of Redisson,
// done the Go way: a lock is held by a context, and that context is cancelled
// the moment the lock is found lost.
//
// A Client wraps one go-redis client (single node, Sentinel failover or
// Cluster). Its Mutex is reentrant through the context Lock returns, renewed
// by one watchdog loop per Client while it is held, and waited for with
// pub/sub rather than polling. Every acquisition carries a fencing token
// (package fencing) that storage can use to refuse writes of a holder that
// lost its lock without noticing in time.
//
// Ownership is per hold: a context re-enters a lock only if it descends from
// an acquisition of that lock. Any other context, even one that holds other
// locks of the Client (a request's context shared by the goroutines it fans
// out), acquires it afresh under an owner id of its own, so those goroutines
// exclude each other. A hold never outlives the context it was taken with:
// when that context ends, the hold is released as if unlocked, and a later
// Unlock returns nil; context.Background() holds until Unlock.
//
// The rest of Redisson's lock family shares that machinery: FairMutex
// (granted in arrival order across every Client), RWMutex (many readers or
// one writer, preferring writers), MultiLock (several locks, all or none),
// Semaphore (a bounded number of holders whose permits expire with them) and
// RedLock (a majority of independent masters). Every acquisition of every
// kind returns a context in the same way, and WithReplicaAck makes
// acquisitions wait for replicas.
//
// The keys are Redisson's, so Go services using this package and Java
// services using Redisson exclude each other on the same lock name.
// docs/LOCKS.md lists each kind beside its Redisson equivalent and where
// behaviour differs.
package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// A Client issues locks on one Redis deployment. It owns a watchdog loop that
// renews the locks it holds and the pub/sub connections its waiters share.
// A Client is safe for concurrent use; create one per Redis deployment and
// process, and Close it when done.
type Client struct {
	*engine // the parts: link, waiting lines, hold table, watchdog

	closeOnce sync.Once
}

// New returns a Client that locks through rdb: a *redis.Client (single node or
// the Sentinel failover client) or a *redis.ClusterClient. It does no I/O.
//
// New never panics on bad input: a nil rdb or an invalid option makes every
// operation of the returned Client fail with an error wrapping ErrInvalid.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	c := &link{
		rdb:     rdb,
		id:      uuid.NewString(),
		publish: "publish",
		opts:    defaultClientOptions(),
	}
	c.life, c.end = context.WithCancel(context.Background())
	c.done = c.life.Done()
	for _, o := range opts {
		if o != nil {
			o(&c.opts)
		}
	}
	c.err = c.opts.err
	c.leaseMS = msArg(c.opts.watchdogTimeout)
	c.tokenTTL = msArg(c.opts.tokenExpiry)
	switch r := rdb.(type) {
	case nil:
		c.err = fmt.Errorf("%w: nil redis client", ErrInvalid)
	case *redis.Client:
		if r == nil {
			c.err = fmt.Errorf("%w: nil redis client", ErrInvalid)
		}
	case *redis.ClusterClient:
		if r == nil {
			c.err = fmt.Errorf("%w: nil redis client", ErrInvalid)
		}
		c.cluster, c.publish = true, "spublish"
	case *redis.Ring:
		c.err = fmt.Errorf("%w: redis.Ring is not supported (use a single node, Sentinel or Cluster client)", ErrInvalid)
	}
	return &Client{engine: newEngine(c)}
}

// ID returns the Client's unique id, the "<clientUUID>" part of the owner
// field "<clientUUID>:<ownerID>" in every lock hash it writes.
func (c *Client) ID() string { return c.id }

// Mutex returns the reentrant lock called name. It does no I/O; an invalid
// name is reported by the first operation on the Mutex.
func (c *Client) Mutex(name string) *Mutex {
	return newMutex(c.part(), name)
}

// FairMutex returns the fair lock called name. It does no I/O; an invalid
// name is reported by the first operation.
func (c *Client) FairMutex(name string) *FairMutex {
	return newFairMutex(c.part(), name)
}

// RWMutex returns the reader/writer lock called name. It does no I/O; an
// invalid name is reported by the first operation.
func (c *Client) RWMutex(name string) *RWMutex {
	return newRWMutex(c.part(), name)
}

// Semaphore returns the semaphore called name with permits permits. It does
// no I/O; an invalid name or a permits count below 1 is reported by the first
// operation (ErrInvalid).
func (c *Client) Semaphore(name string, permits int) *Semaphore {
	return newSemaphore(c.part(), name, permits)
}

// MultiLock returns the lock over all the names. It does no I/O; no names or
// an invalid name is reported by the first operation (ErrInvalid).
func (c *Client) MultiLock(names ...string) *MultiLock {
	return newMultiLock(c.part(), names...)
}

// part returns the engine of c, nil for a nil Client: the lock values of a
// nil Client report ErrInvalid from their first operation.
func (c *Client) part() *engine {
	if c == nil {
		return nil
	}
	return c.engine
}

// Close stops the watchdog and the subscriptions. Locks still held are not
// released: nothing renews them any more and they expire with their lease;
// their contexts are cancelled with a cause wrapping ErrLost and ErrClosed.
// Goroutines waiting for a lock return ErrClosed. Close waits for the
// Client's background goroutines and is safe to call more than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.stopBackground()
		c.subs.close()
		for _, h := range c.holds.held() {
			if h.lose() {
				h.end(closedError(h.name))
			}
		}
	})
	c.bg.Wait()
	return nil
}

// Err reports whether the Client can be used: nil when it can, otherwise
// the error every operation of it fails with: one wrapping ErrInvalid when
// New was given no Redis client or a bad option (a namespace with a brace,
// too short a watchdog timeout), ErrClosed once Close was called. It does no
// I/O: a Redis that cannot be reached is reported, with ErrUnavailable, by
// the operations that need it.
func (c *Client) Err() error { return c.usable() }

// usable returns the error every operation of c starts with, if any.
func (c *Client) usable() error {
	if c == nil {
		return fmt.Errorf("%w: nil lock client", ErrInvalid)
	}
	return c.link.usable()
}

// Namespace returns the namespace every lock name of the Client is
// prefixed with (WithNamespace), "" for none.
func (c *Client) Namespace() string {
	if c == nil {
		return ""
	}
	return c.opts.namespace
}

// Key returns the Redis key of the lock called name: the name with the
// Client's namespace in front ("ns:sku:42"), the name itself without one.
// Logs, errors and the inspector show this full key.
func (c *Client) Key(name string) string {
	if c == nil {
		return name
	}
	return c.key(name)
}

// WatchdogTimeout returns the lease of the locks this Client holds without
// WithLease, which its watchdog renews every third of it: the
// WithWatchdogTimeout the Client was made with, or DefaultWatchdogTimeout.
// Whatever should free itself when the Client's process dies, as its locks
// do, can take the same lease.
func (c *Client) WatchdogTimeout() time.Duration { return c.opts.watchdogTimeout }

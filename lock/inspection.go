package lock

// What Inspect reports: the inspection of one lock name and its parts.

import "time"

// An Inspection is what Redis holds for one lock name, read in one script
// call, so its parts are one consistent snapshot. Durations are remaining
// times by the Redis server's clock.
type Inspection struct {
	Name string // the name as given to Inspect
	Key  string // its Redis key (the namespace applied)
	Kind Kind
	Mode string // RWMutex: "read" or "write"

	// Owners are the holders: owner fields with their hold counts, readers
	// and writer of an RWMutex, permit holders of a Semaphore.
	Owners []Owner
	// Lease is what is left of the lock key's expiry: 0 when it is free, -1
	// when the key has none (nothing will ever free it but an unlock or
	// ForceUnlock).
	Lease time.Duration

	Token    int64         // the fencing counter's value, 0 when there is none
	TokenTTL time.Duration // its idle expiry, -1 when it has none

	// Free is a Semaphore's count of free permits: with its Owners, the
	// number of permits Redis holds for the name.
	Free int64

	// Queue is a FairMutex's line, first waiter first (at most
	// InspectLimit; QueueLen counts them all).
	Queue    []Waiter
	QueueLen int64
	// Writers are an RWMutex's waiting writers, which keep new readers out
	// (at most InspectLimit; WritersLen counts them all).
	Writers    []Waiter
	WritersLen int64

	// Channels are the lock's unlock channels with the number of
	// connections subscribed to each: every waiting Client of this package
	// subscribes once per channel, however many of its goroutines wait, and
	// so does every waiting Redisson client. A FairMutex waiter has a
	// channel of its own. On a Cluster these are sharded channels
	// (PUBSUB SHARDNUMSUB on the master of the lock's slot).
	Channels []Channel
}

// An Owner is one holder of a lock.
type Owner struct {
	// Field is the holder as Redis names it, "<clientID>:<ownerID>"
	// (Redisson: "<connection manager id>:<thread id>"), with ":write" for
	// an RWMutex's writer; a Redisson semaphore permit's id in hex.
	Field    string
	ClientID string // the first part: Client.ID of the holding Client
	OwnerID  string // the second part: the hold's owner id (Java: thread id)
	Holds    int64  // the hold count: how many Unlocks free it
	Write    bool   // an RWMutex's write hold
	// Lease is the holder's own remaining lease, for the holds of an
	// RWMutex (read and write; a Redisson reader's is the longest PTTL among
	// its timeout keys) and permits of a Semaphore (-1 for a Redisson
	// permit without a lease); 0 when the key's Lease applies.
	Lease time.Duration
}

// A Waiter is a place in a wait line: the waiter and how long it keeps the
// place without renewing it.
type Waiter struct {
	Field    string
	ClientID string
	OwnerID  string
	// Expires is the time left to renew the place (negative: overdue,
	// given away by the next acquisition). For a waiter of this package in
	// a FairMutex's line it is its liveness, renewed by its Client's
	// watchdog; for a foreign one, its Deadline.
	Expires time.Duration
	// Foreign marks a FairMutex waiter that is not this package's: a
	// Redisson client's (or one of ours whose liveness entry is gone). It is
	// given up only when its Deadline passes, so a dead one first in line
	// keeps the free lock from everyone until then.
	Foreign bool
	// Deadline is a FairMutex waiter's time left to its deadline in
	// Redisson's line (its client's clock, read against the server's): a
	// first waiter past it is dropped as stale. 0 for other lines.
	Deadline time.Duration
}

// A Channel is an unlock channel and how many connections subscribe to it.
type Channel struct {
	Name        string
	Subscribers int64
}

// A Kind names the layout a lock name has in Redis.
type Kind string

// The layouts Inspect recognises.
const (
	KindNone      Kind = ""          // no lock key: free
	KindMutex     Kind = "mutex"     // Redisson's RLock hash: Mutex, FairMutex, MultiLock member, RedLock node
	KindRWMutex   Kind = "rwmutex"   // Redisson's RReadWriteLock hash (a "mode" field)
	KindSemaphore Kind = "semaphore" // Redisson's RPermitExpirableSemaphore: free permits, permits handed out
)

package lock

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// A RedLock is one lock over N independent Redis deployments (N Clients, each
// on its own master; not replicas of one another, not one Cluster): it is
// held when a majority of N/2+1 of them hold it. It is antirez's Redlock
// algorithm, as Redisson's RedissonRedLock implements it:
//
//   - An attempt sends the Mutex acquire script to every node at once, each
//     bounded by a short timeout (a tenth of the lease, between 50ms and
//     1s), and succeeds when a majority took it within the validity time:
//     lease - elapsed - drift (drift = lease/100 + 2ms). Otherwise it
//     releases every node it may have taken and waits, for an unlock
//     message from any node or the shortest remaining lease, with a random
//     delay after a split vote so that contenders do not collide forever.
//   - While held, each node is renewed by its own Client's watchdog, and
//     without WithLease each node's lease is its own Client's watchdog
//     timeout, so that the renewals of every node come at a third of the
//     lease they extend whatever the other Clients' timeouts; a node
//     whose renewals fail until its lease ends is lost, and when fewer than
//     a majority remain the RedLock's context is cancelled with a cause
//     matching both ErrLost and ErrNoQuorum, and the nodes left are
//     released at once (its Unlock then answers with that loss). With
//     WithLease it ends after the validity time instead.
//   - When fewer than a majority of the nodes can be reached at all, Lock
//     fails at once with ErrNoQuorum rather than waiting: that is an outage,
//     not contention.
//
// Be honest about what this buys. Martin Kleppmann ("How to do distributed
// locking", 2016) showed that Redlock's safety rests on timing assumptions:
// a process pause, a network delay or a clock jump longer than the
// remaining validity lets two holders overlap, and Redlock itself offers no
// way to detect it. antirez's reply ("Is Redlock safe?") defends the
// algorithm when clocks are monotonic and bounded, which real deployments
// cannot promise either. Neither disputes that a lock protecting
// correctness needs fencing at the storage. So this RedLock issues one:
// the context carries the largest of the tokens its majority issued, and
// that token is written back to the majority's counters before Lock
// returns. Any later acquisition's majority shares at least one node with
// this one, whose counter is now at least this token, so every later
// RedLock token is larger: fence your writes with it (package fencing,
// gormplugin) and a holder that overlapped another is refused at the
// database. A RedLock costs 2 round trips (in parallel over the nodes) to
// acquire and N renewals per period; consider one Redis with fencing first.
//
// Each node uses the Mutex layout under the node Client's namespace: a
// Mutex of the same name on one node's Client and the RedLock exclude each
// other there. A RedLock is reentrant through its context. It does no I/O
// until used and may be copied freely.
type RedLock struct {
	handle  // no Client: it has clients
	clients []*Client
	nodes   []*Mutex // nodes[i] is the lock on clients[i]
	order   []int    // client indexes in a global order (by Client id)
	quorum  int
	id      string
}

// redKey is the context key of a RedLock's hold.
type redKey struct{ id string }

// A redHold is one acquisition of a RedLock and its re-entries.
type redHold struct {
	compoundHold // its holds are the nodes it holds, by client index; nil where it has none

	mu    sync.Mutex // guards levels, ended, alive and lost
	alive int        // nodes still held
	lost  error      // why it lost its majority, once it did: its nodes left were released then
}

// NewRedLock returns the lock called name over clients, one Client per
// independent Redis master. It does no I/O; no clients, a nil or repeated
// Client or an invalid name is reported by the first operation (ErrInvalid).
func NewRedLock(name string, clients ...*Client) *RedLock {
	r := &RedLock{handle: handle{name: name, given: name}, clients: clients, quorum: len(clients)/2 + 1}
	if len(clients) == 0 {
		r.checkErr = fmt.Errorf("%w: a RedLock needs at least one Client", ErrInvalid)
		return r
	}
	seen := make(map[*Client]bool)
	ids := make([]string, 0, len(clients))
	for i, c := range clients {
		if c == nil {
			r.checkErr = fmt.Errorf("%w: Client %d of the RedLock is nil", ErrInvalid, i)
			return r
		}
		if seen[c] {
			r.checkErr = fmt.Errorf("%w: Client %d appears twice in the RedLock: each node counts once", ErrInvalid, i)
			return r
		}
		seen[c] = true
		m := newMutex(c.part(), name)
		if m.checkErr != nil {
			r.checkErr = m.checkErr
			return r
		}
		r.nodes = append(r.nodes, m)
		r.order = append(r.order, i)
		ids = append(ids, c.id)
	}
	r.name = r.nodes[0].name // the first node's full name: errors and logs show it
	sort.Slice(r.order, func(a, b int) bool { return clients[r.order[a]].id < clients[r.order[b]].id })
	sort.Strings(ids)
	r.id = name + "\x00" + strings.Join(ids, "\x00")
	return r
}

// Name returns the lock's name as given to NewRedLock.
func (r *RedLock) Name() string {
	if r == nil {
		return ""
	}
	return r.given
}

// Quorum returns how many nodes must hold the lock: N/2+1.
func (r *RedLock) Quorum() int {
	if r == nil {
		return 0
	}
	return r.quorum
}

func (r *RedLock) usable() error {
	if r == nil {
		return fmt.Errorf("%w: nil redlock", ErrInvalid)
	}
	if err := r.handle.usable(); err != nil {
		return err
	}
	for _, c := range r.clients {
		if err := c.usable(); err != nil {
			return wrap(r.name, err)
		}
	}
	return nil
}

// timing returns the lease a RedLock acquisition is valid for (the shortest
// lease of its nodes: see nodeLease), each node call's timeout and the clock
// drift allowance.
func (r *RedLock) timing(lo lockOptions) (lease, nodeTimeout, drift time.Duration) {
	lease = lo.lease
	if lease <= 0 {
		for i, c := range r.clients {
			if i == 0 || c.opts.watchdogTimeout < lease {
				lease = c.opts.watchdogTimeout
			}
		}
	}
	nodeTimeout = min(max(lease/10, 50*time.Millisecond), time.Second)
	drift = lease/100 + 2*time.Millisecond
	return lease, nodeTimeout, drift
}

// nodeLease returns the lease of node i: the fixed lease when there is one,
// else the watchdog timeout of the node's Client, which renews it every third
// of that.
func (r *RedLock) nodeLease(i int, lo lockOptions) time.Duration {
	if lo.lease > 0 {
		return lo.lease
	}
	return r.clients[i].opts.watchdogTimeout
}

// lockOptions returns the options of an acquisition: opts alone. The
// Clients' own WithReplicaAck defaults do not apply: the nodes of a RedLock
// are independent masters. Asking for it here is a mistake (lo.err).
func (r *RedLock) lockOptions(opts []LockOption) lockOptions {
	var lo lockOptions
	for _, f := range opts {
		if f != nil {
			f(&lo)
		}
	}
	if lo.err == nil && lo.ack.replicas > 0 {
		lo.err = fmt.Errorf("%w: replica acknowledgement does not apply to a RedLock (its nodes are independent masters)", ErrInvalid)
	}
	return lo
}

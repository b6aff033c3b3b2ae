package lock

// What an attempt of a single-key acquisition sends (its lease arguments,
// its place in a wait line) and how its reply reads; the attempt itself
// (engine.attempt) and the wait that makes it are in wait.go.

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// inLine records that h's owner has a place in a wait line in Redis, which
// the watchdog keeps alive with script (the kind's batch script for places in
// line, given h's keys and args) until the owner acquires or gives up. Each
// attempt that leaves the owner in line calls it again: the attempt itself
// renewed the place.
func (c *engine) inLine(h *hold, script *script, keys []string, args []any) {
	if h.waiting == nil {
		channel := h.kind.channel(h)
		h.waiting = &renewal{script: script, keys: keys, args: args, lost: func(string) {
			// The place was given away: this process stalled for longer
			// than the watchdog timeout. The next attempt queues again at
			// the end of the line; make it now.
			c.deliver(channel)
		}}
	}
	h.queued = true
	c.dog.add(h.waiting, time.Now().Add(c.opts.watchdogTimeout))
}

// leaseArgs returns the script arguments of h's lease for a first
// acquisition and for a re-entry: for a fixed hold the lease a re-entry asks
// for (WithLease), which the scripts apply only where it lasts longer than
// the lease left, or else "0", which keeps its deadline; for a hold the
// watchdog renews its lease, as a renewal would set it.
func (c *engine) leaseArgs(h *hold) (first, again any) {
	first = c.leaseArg(h.lease)
	switch {
	case h.fixed && h.relet > 0:
		return first, c.leaseArg(h.relet)
	case h.fixed:
		return first, "0"
	}
	return first, first
}

// msArg returns d as a script argument: its whole milliseconds, in decimal.
// Every duration a script is given goes through it (leases, timeouts,
// expiries), so that they all read it alike (tonumber, or passed on to
// PEXPIRE as it is).
func msArg(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// A pairReply is the reply {status, value} of the acquire scripts of the
// FairMutex, the RWMutex and the Semaphore: status 1 is an acquisition
// (value: its token, 0 for kinds without), 0 a lock held by others (value:
// its remaining lease, as retryAfter reads it); each script says what its
// other statuses mean.
type pairReply struct {
	status, value int64
	vals          []int64 // the reply as it came, for errors
}

// readPair reads a pairReply from cmd.
func readPair(cmd *redis.Cmd) (pairReply, error) {
	vals, err := cmd.Int64Slice()
	r := pairReply{vals: vals}
	if len(vals) == 2 {
		r.status, r.value = vals[0], vals[1]
	}
	return r, err
}

// is reports whether r is a well-formed reply of the given status.
func (r pairReply) is(status int64) bool { return len(r.vals) == 2 && r.status == status }

// unexpected is the error for a reply of no known shape from the script
// named what.
func (r pairReply) unexpected(what string) error {
	return fmt.Errorf("unexpected reply %v from the %s script", r.vals, what)
}

// retryAfter turns the PTTL an acquire script reported into how long to wait
// for an unlock message at most.
func retryAfter(c *link, pttl int64) time.Duration {
	switch {
	case pttl == -1: // a key without expiry: not written by a lock; look again after a watchdog timeout
		return c.opts.watchdogTimeout
	case pttl < 0: // gone meanwhile
		return 0
	}
	return time.Duration(pttl) * time.Millisecond
}

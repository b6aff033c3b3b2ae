package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// A RedLock acquisition is a run of attempts, each a vote and its tally:
// the acquire script goes to every node at once (vote), and the answers are
// counted (tally). A majority within the validity time whose counters are
// raised to its token wins; otherwise every node the attempt may have taken
// is released and the wait decides when to try again (refused).

// A redAcquisition is one acquisition of a RedLock: what each of its
// attempts needs, and what the last one took.
type redAcquisition struct {
	r      *RedLock
	holds  []*hold // by client index: the hold of each node, carried or new
	lo     lockOptions
	leases []any // by client index: the lease argument of each node (see nodeLease)

	lease, nodeTimeout, drift time.Duration // see timing

	split bool          // the last vote was split: the next attempt waits a random moment first
	start time.Time     // when the last attempt was sent
	taken []bool        // by client index: the nodes the last attempt took
	token fencing.Token // the token of the attempt that won
}

// newAcquisition returns an acquisition of the nodes' holds with the
// options lo.
func (r *RedLock) newAcquisition(holds []*hold, lo lockOptions) *redAcquisition {
	a := &redAcquisition{r: r, holds: holds, lo: lo, leases: make([]any, len(r.clients))}
	a.lease, a.nodeTimeout, a.drift = r.timing(lo)
	for i, c := range r.clients {
		if h := holds[i]; h.levels > 0 {
			a.leases[i] = reentryArg(h, lo.lease) // a node hold ctx carries: never weakened
			continue
		}
		a.leases[i] = c.leaseArg(r.nodeLease(i, lo))
	}
	return a
}

// try is one attempt of a: a vote and its tally.
func (a *redAcquisition) try(ctx context.Context) (bool, time.Duration, error) {
	if a.split {
		if err := a.pause(ctx); err != nil {
			return false, 0, err
		}
	}
	a.start = time.Now()
	b := a.tally(a.vote(ctx))
	a.taken = b.taken
	if a.won(ctx, b) {
		return true, 0, nil
	}
	return a.refused(ctx, b)
}

// pause waits a random moment after a split vote, so that contenders that
// split the nodes between them do not collide again, or until ctx ends.
func (a *redAcquisition) pause(ctx context.Context) error {
	pause := rand.N(min(a.lease/10, 50*time.Millisecond) + time.Millisecond)
	select {
	case <-time.After(pause):
		return nil
	case <-ctx.Done():
		return ctxErr(a.r.name, ctx)
	}
}

// vote sends the acquire script to every node at once, each call bounded by
// the node timeout, and returns their answers.
func (a *redAcquisition) vote(ctx context.Context) []nodeResult {
	r := a.r
	return r.each(ctx, a.nodeTimeout, func(ctx context.Context, i int) (any, error) {
		h := a.holds[i]
		n, err := r.clients[i].run(ctx, acquireScript, r.nodes[i].keys, a.leases[i], h.field, h.levels, r.clients[i].tokenTTL).Int64()
		return acquireReply(n), err
	})
}

// A ballot is the tally of one vote, by client index.
type ballot struct {
	res    []nodeResult
	taken  []bool          // the nodes that took the lock, or re-entered it
	tokens []fencing.Token // their tokens
	ok     int             // how many took it
	failed int             // how many could not be asked
	errs   []error         // why
	retry  time.Duration   // the shortest lease of a node held by another owner; -1 for none
}

// tally counts the answers of a vote.
func (a *redAcquisition) tally(res []nodeResult) *ballot {
	b := &ballot{res: res, taken: make([]bool, len(res)), tokens: make([]fencing.Token, len(res)), retry: -1}
	for i, x := range res {
		if x.err != nil {
			b.failed++
			b.errs = append(b.errs, noted(fmt.Sprintf("node %d", i), unavailable(x.err)))
			continue
		}
		a.count(b, i, x.val.(acquireReply))
	}
	return b
}

// count records in b the reply of node i.
func (a *redAcquisition) count(b *ballot, i int, reply acquireReply) {
	h := a.holds[i]
	switch {
	case reply.token() > 0 || reply.reentered():
		b.taken[i] = true
		b.ok++
		b.tokens[i] = reply.token()
		if h.levels > 0 {
			b.tokens[i] = h.token
		}
	case reply.held():
		if d := retryAfter(a.r.clients[i].link, reply.pttl()); b.retry < 0 || d < b.retry {
			b.retry = d
		}
	default:
		// A node this owner held is gone: its hold is lost, and the node
		// counts as refused. Trying again at once would find it gone
		// again: the wait is for the other nodes.
		h.lostBecause("its hold was gone when a RedLock re-entered it")
	}
}

// valid reports whether the last attempt is within its validity time:
// lease - elapsed - drift.
func (a *redAcquisition) valid() bool { return a.lease-time.Since(a.start)-a.drift > 0 }

// won reports whether the vote b took a majority within the validity time
// and that majority's counters stand at its token now (the largest of its
// tokens, a.token), still within the validity time.
func (a *redAcquisition) won(ctx context.Context, b *ballot) bool {
	if b.ok < a.r.quorum || !a.valid() {
		return false
	}
	a.token = 0
	for i, took := range b.taken {
		if took {
			a.token = max(a.token, b.tokens[i])
		}
	}
	return a.r.raise(ctx, a.nodeTimeout, b.taken, b.tokens, a.token) >= a.r.quorum && a.valid()
}

// refused ends an attempt that did not win: it releases every node that may
// have been taken, and returns what the wait does next: give up (ctx ended,
// too few nodes reachable: ErrNoQuorum) or try again after the retry.
func (a *redAcquisition) refused(ctx context.Context, b *ballot) (bool, time.Duration, error) {
	r := a.r
	unknown := make([]bool, len(r.clients))
	for i, x := range b.res {
		unknown[i] = b.taken[i] || (x.err != nil && outcomeUnknown(x.err))
	}
	r.rollback(ctx, a.nodeTimeout, a.holds, unknown)
	for i, took := range b.taken {
		if took && a.holds[i].levels > 0 {
			keepStretched(a.holds[i], a.start, a.lo.lease) // a node hold ctx carries
		}
	}
	a.split = b.ok > 0
	switch {
	case ctxend.Ended(ctx):
		return false, 0, ctxErr(r.name, ctx)
	case b.failed > len(r.clients)-r.quorum:
		return false, 0, wrap(r.name, fmt.Errorf("%w: %d of %d nodes unreachable, %d needed: %w",
			ErrNoQuorum, b.failed, len(r.clients), r.quorum, errors.Join(b.errs...)))
	}
	return false, max(b.retry, 0), nil // 0: the majority was too slow, not refused: try again
}

// A nodeResult is the outcome of one node's call.
type nodeResult struct {
	val any
	err error
}

// each runs f for every node at once, each bounded by timeout, and waits for
// all of them.
func (r *RedLock) each(ctx context.Context, timeout time.Duration, f func(ctx context.Context, i int) (any, error)) []nodeResult {
	out := make([]nodeResult, len(r.clients))
	var wg sync.WaitGroup
	for i := range r.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := f(nctx, i)
			out[i] = nodeResult{v, err}
		}()
	}
	wg.Wait()
	return out
}

// raise makes the token counters of the nodes taken at least t and returns
// how many taken nodes have such a counter now.
func (r *RedLock) raise(ctx context.Context, timeout time.Duration, taken []bool, tokens []fencing.Token, t fencing.Token) int {
	res := r.each(ctx, timeout, func(ctx context.Context, i int) (any, error) {
		if !taken[i] || tokens[i] >= t {
			return nil, nil
		}
		return nil, r.clients[i].run(ctx, raiseTokenScript, r.nodes[i].keys[1:], int64(t), r.clients[i].tokenTTL).Err()
	})
	n := 0
	for i, x := range res {
		if taken[i] && x.err == nil {
			n++
		}
	}
	return n
}

// rollback undoes, on the nodes marked, the level an attempt added.
func (r *RedLock) rollback(ctx context.Context, timeout time.Duration, holds []*hold, marked []bool) {
	rctx := context.WithoutCancel(ctx)
	r.each(rctx, timeout, func(ctx context.Context, i int) (any, error) {
		if !marked[i] {
			return nil, nil
		}
		c := r.clients[i]
		return nil, c.run(ctx, releaseScript, r.nodes[i].relKeys, holds[i].field, holds[i].levels+1, c.publish).Err()
	})
}

// keepStretched ends a failed attempt of a compound lock, sent at start with
// the lease of WithLease (0: none), whose script re-entered h, a hold its
// context carries, and whose rollback has taken that level off again. The
// script extended a fixed hold's lock in Redis to lease (see reentryArg) and
// the rollback leaves the expiry as it is: h is extended to start+lease as a
// re-entry would be, so that the lock has its owner for as long as Redis
// keeps it; a hold that ended while the attempt was on its way has its
// owner removed instead (see dropOwner), so that nobody's lock stays held.
// An attempt whose outcome is unknown is not ended so: h must not outlive
// a lock Redis may not have extended. The caller holds h's semaphore.
func keepStretched(h *hold, start time.Time, lease time.Duration) {
	if !h.fixed || lease <= 0 {
		return
	}
	h.extendTo(start.Add(lease))
	if !h.held() {
		h.dropOwner(context.Background())
	}
}

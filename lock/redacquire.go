package lock

// A RedLock's acquisition and release: a vote of its nodes (redvote.go),
// a wait on their unlock channels (redwait.go), re-entry, the end of its
// parent context, and the release of every node.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Lock acquires the lock on a majority of its nodes, waiting as long as it
// takes or until ctx ends, and returns the context that holds it (see
// Mutex.Lock and the RedLock documentation for its token and its loss). If
// ctx holds the RedLock already, Lock re-enters it at once. The acquisition
// ends with ctx: it is released on every node as its final Unlock would, and
// an Unlock that comes later returns nil.
func (r *RedLock) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return r.acquire(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: it gives up after wait with
// ErrNotAcquired. wait 0 makes exactly one attempt; a negative wait is an
// error (ErrInvalid).
func (r *RedLock) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(r.Name(), wait); err != nil {
		return ctx, err
	}
	return r.acquire(ctx, wait, opts)
}

func (r *RedLock) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := r.usable(); err != nil {
		return ctx, err
	}
	lo := r.lockOptions(opts)
	if err := startAcquire(ctx, r.name, lo); err != nil {
		return ctx, err
	}
	if r.reenter(ctx) {
		return ctx, nil
	}
	// A node whose lock ctx holds already (a Mutex of the name on that
	// node's Client) is re-entered; the others are taken afresh.
	p, err := enterParts(ctx, r.name, r.nodes, r.order, true)
	if err != nil {
		return ctx, err
	}
	defer p.exit()
	a := r.newAcquisition(p.holds, lo)
	if err := r.wait(ctx, p.carried, wait, a); err != nil {
		return ctx, err
	}
	return r.hold(ctx, p, a), nil
}

// reenter adds a level to the acquisition of the RedLock that ctx carries,
// if there is one and it is held still, and reports whether it did.
func (r *RedLock) reenter(ctx context.Context) bool {
	rh, _ := ctx.Value(redKey{r.id}).(*redHold)
	if rh == nil {
		return false
	}
	rh.mu.Lock()
	defer rh.mu.Unlock()
	ok := rh.levels > 0 && rh.ctx.Err() == nil
	if ok {
		rh.levels++
	}
	return ok
}

// wait runs the attempts of a until one takes a majority, within wait. The
// wait queues on the first node ctx does not hold already (carried: the
// nodes it does): the waiters of a node it holds (a Mutex's, on that
// node's Client) may wait for this very owner, and a RedLock behind them
// would wait for itself. With a node held, the first attempt goes ahead of
// them.
func (r *RedLock) wait(ctx context.Context, carried []bool, wait time.Duration, a *redAcquisition) error {
	rw := &redWait{r: r}
	reentry := false
	for i := len(r.clients) - 1; i >= 0; i-- {
		if carried[i] {
			reentry = true
		} else {
			rw.home = i
		}
	}
	defer rw.close()
	err := r.clients[rw.home].waitFor(ctx, waitSpec{
		name: r.name, channel: r.nodes[rw.home].unlockCh, wait: wait, lease: a.lease, try: a.try,
		subscribe: rw.subscribe, eager: reentry,
	})
	return acquireErr(ctx, r.name, err)
}

// hold records the acquisition a, whose last attempt took a majority of
// the nodes, with the parts p.
func (r *RedLock) hold(base context.Context, p *parts, a *redAcquisition) context.Context {
	lo, start := a.lo, a.start
	rh := &redHold{compoundHold: compoundHold{levels: 1, holds: make([]*hold, len(p.holds)), carried: p.carried, token: a.token}}
	rctx := rh.begin(base)
	if lo.lease > 0 {
		rctx, rh.expire = context.WithDeadlineCause(rctx, start.Add(a.lease-a.drift),
			lostError(r.name, "its validity of "+(a.lease-a.drift).String()+" ran out"))
	}
	for i, h := range p.holds {
		if !a.taken[i] {
			continue
		}
		rh.holds[i] = h
		rh.alive++
		if h.levels > 0 {
			reenteredBy(h, start, lo.lease) // the node's counter was raised to the RedLock's token
			continue
		}
		h.prepare(r.nodes[i], lo) // its lease is nodeLease(i, lo)
		h.token, h.top = a.token, 0
		h.establish(base, start)
		h.tieToParent()
	}
	rh.watch(func(i int, cause error) { r.nodeEnded(rh, i, cause) })
	return rh.publish(rctx, redKey{r.id}, rh, func() { r.parentEnded(rh) })
}

// nodeEnded counts the loss of node i of the acquisition rh, whose hold's
// context ended with cause: when fewer than a majority are left, rh's
// context ends with a cause matching ErrLost and ErrNoQuorum.
func (r *RedLock) nodeEnded(rh *redHold, i int, cause error) {
	if !errors.Is(cause, ErrLost) && !errors.Is(cause, ErrReleased) {
		return // the caller's context ended: the RedLock's ends with it
	}
	rh.mu.Lock()
	rh.alive--
	alive := rh.alive
	rh.mu.Unlock()
	if alive < r.quorum {
		lost := wrap(r.name, because(ErrLost, fmt.Errorf("%w: %d of %d nodes left (node %d: %w)",
			ErrNoQuorum, alive, len(r.clients), i, cause)))
		rh.cancel(lost)
		r.endLost(rh, lost)
	}
}

// endLost releases, on every node it holds still, the acquisition rh,
// which lost its majority with cause lost, as its final Unlock would: the
// nodes that survive stop being renewed and are free for others without
// waiting for the caller's Unlock, which then answers with the loss.
func (r *RedLock) endLost(rh *redHold, lost error) {
	rh.mu.Lock()
	final := rh.levels > 0
	rh.levels = 0
	if final {
		rh.lost = lost
	}
	rh.mu.Unlock()
	if !final {
		return
	}
	rh.stopWatching()
	r.releaseNodes(context.Background(), rh)
}

// parentEnded releases the RedLock acquisition rh because the context it was
// taken with ended, as its final Unlock would: the nodes it took release
// themselves (tieToParent); the levels it added to node locks that context
// held already are released here.
func (r *RedLock) parentEnded(rh *redHold) {
	rh.mu.Lock()
	final := rh.levels > 0
	rh.levels = 0
	rh.ended = rh.ended || final
	rh.mu.Unlock()
	if !final {
		return
	}
	for i, h := range rh.holds {
		if h == nil || !rh.carried[i] {
			continue
		}
		one := rh.holds[i : i+1]
		enterAll(one)
		endCarried(h, 1)
		exitAll(one)
	}
	rh.stopParts()
	if rh.expire != nil {
		rh.expire()
	}
}

// Unlock releases one level of the RedLock held by ctx; the final Unlock
// releases every node it holds, at once, and cancels the context with cause
// ErrReleased. A node whose release fails is retried in the background
// until its lease ends; one that cannot be released is left to expire with
// its lease (nothing renews it any more), and so is the node of a Client
// closed meanwhile. Unlock returns ErrNotHeld when ctx does not hold the lock, and
// an error matching ErrLost when the lock had lost its majority.
func (r *RedLock) Unlock(ctx context.Context) error {
	if r == nil {
		return fmt.Errorf("%w: nil redlock", ErrInvalid)
	}
	if r.checkErr != nil {
		return wrap(r.name, r.checkErr)
	}
	// A closed Client's node was given up when it closed (it counts as
	// lost); the others are still released.
	rh, err := heldCompound[*redHold](ctx, redKey{r.id}, r.name)
	if err != nil {
		return err
	}
	if final, err := r.unlockLevel(rh); !final {
		return err
	}
	rh.stopWatching()
	r.releaseNodes(ctx, rh)
	return rh.released(r.name)
}

// unlockLevel takes one level off rh and reports whether it was the last;
// when rh had none left it reports the error of the Unlock.
func (r *RedLock) unlockLevel(rh *redHold) (final bool, err error) {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if rh.levels == 0 {
		switch {
		case rh.ended:
			return false, nil // released when the context it was taken with ended
		case rh.lost != nil:
			return false, rh.lost // released when it lost its majority
		}
		return false, wrap(r.name, ErrNotHeld)
	}
	rh.levels--
	return rh.levels == 0, nil
}

// releaseNodes releases every node rh holds, at once, for the final Unlock
// with ctx. A node whose release fails is retried in the background until
// its lease ends (see settle); one that cannot be released at all is given
// up: nothing renews it, and it expires with its lease; but a node hold the RedLock's context
// carried (the caller's own) is not given up: only the RedLock's level of
// it goes, and it stays held and renewed for its owner.
func (r *RedLock) releaseNodes(ctx context.Context, rh *redHold) {
	_, timeout, _ := r.timing(lockOptions{})
	var wg sync.WaitGroup
	for i, h := range rh.holds {
		if h == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.clients[i]
			_ = h.enter(context.Background())
			defer h.leave()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			defer cancel()
			err := c.releaseLevel(rctx, h)
			switch {
			case err == nil || errors.Is(err, ErrLost) || errors.Is(err, ErrNotHeld):
			case rh.carried[i]:
				// The caller's own hold of the node, which its context
				// held before the RedLock: it keeps its own levels and
				// stays renewed. The RedLock's level is let go of, as
				// endCarried does: the final release removes it.
				if h.levels > 1 && h.held() {
					h.levels--
				}
				c.opts.logger.WarnContext(ctx, "lock: could not release a RedLock's level of a node its context held already; the final release removes it",
					"lock", r.name, "node", i, "err", err)
			case h.retrying:
				// Its final release failed: the Client retries it in the
				// background until it gets through or the node's lease
				// ends (see settle), as for a Mutex.
				c.opts.logger.WarnContext(ctx, "lock: could not release a RedLock node; retried in the background until its lease ends",
					"lock", r.name, "node", i, "err", err)
			default:
				// Unreachable: stop renewing it; it expires with its lease.
				if h.lose() {
					h.end(wrap(r.name, ErrReleased))
				}
				c.opts.logger.WarnContext(ctx, "lock: could not release a RedLock node; it expires with its lease",
					"lock", r.name, "node", i, "err", err)
			}
		}()
	}
	wg.Wait()
}

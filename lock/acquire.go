package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
)

// The single-key acquire path: every Mutex, FairMutex, RWMutex side and
// Semaphore acquisition goes through engine.acquire, which takes a hold
// afresh or re-enters the one the context carries (levels.go), and makes
// the outcome the caller's error; the checks every kind starts with are
// here too. The wait and its attempts are in wait.go, the script
// arguments of an attempt in attempt.go.

// A handle is what every lock value starts its operations with: its Client,
// its name and what was wrong with it when it was made, which every
// operation reports.
type handle struct {
	c        *engine
	name     string // the full Redis name, namespace included: errors and logs show it
	given    string // the name as given: Name returns it
	checkErr error
}

// usable returns the error every operation of the lock starts with, if any:
// bad input when the lock was made, or a Client that cannot work (nil,
// badly made, closed). A lock of several Clients (RedLock) has none here and
// asks each of its own.
func (l *handle) usable() error {
	if l.checkErr != nil {
		return wrap(l.name, l.checkErr)
	}
	if l.c == nil {
		return nil
	}
	if err := l.c.usable(); err != nil {
		return wrap(l.name, err)
	}
	return nil
}

// checkWait returns the error of a bounded wait that is negative, for the
// lock called name: bad input.
func checkWait(name string, wait time.Duration) error {
	if wait < 0 {
		return wrap(name, fmt.Errorf("%w: negative wait %v", ErrInvalid, wait))
	}
	return nil
}

// acquire takes a hold of role on key through kind k for an acquisition of
// its own, or re-enters the hold ctx carries under hk (see heldKey): the one
// way every single-key lock type locks. wait < 0 waits without bound. The
// steps below it report what happened as it is (a Redis error, the end of
// ctx, a refusal); acquireErr, here alone, makes it the caller's error.
func (c *engine) acquire(ctx context.Context, k kind, key string, r role, hk any, name string, wait time.Duration, opts []LockOption) (context.Context, error) {
	if ctx == nil {
		return ctx, noContext(name)
	}
	lo := c.lockOptions(opts)
	if lo.err != nil {
		return ctx, wrap(name, lo.err)
	}
	hctx, err := ctx, error(nil)
	h := heldBy(ctx, hk)
	switch {
	case ctxend.Ended(ctx):
		err = ctx.Err()
	case h == nil:
		var fresh *hold = c.holds.ref(c, holdID{key, r, c.owners.Add(1)}, hk, name)
		hctx, err = fresh.firstLevel(ctx, k, wait, lo)
	default:
		hctx, err = h.addLevel(ctx, lo.lease)
	}
	if err != nil {
		return ctx, acquireErr(ctx, name, err)
	}
	return hctx, nil
}

// leaseArg returns the script argument for a lease of d (see msArg), boxed
// once for the watchdog timeout, the lease of most holds.
func (c *link) leaseArg(d time.Duration) any {
	if d == c.opts.watchdogTimeout {
		return c.leaseMS
	}
	return msArg(d)
}

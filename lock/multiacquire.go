package lock

// A MultiLock's acquisition: every lock or none, taken group by group (a
// group: the locks of one hash slot, taken in one script call), waiting for
// the group that is held, and rolled back on failure.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/fencing"
)

// Lock acquires every lock of the set, waiting as long as it takes or until
// ctx ends, and returns the context that holds them (see Mutex.Lock). Each
// lock ctx holds already (through this MultiLock or a Mutex of its name) is
// re-entered, the others are taken afresh. The acquisition ends with ctx: its
// levels are released as its final Unlock would, and an Unlock that comes
// later returns nil.
func (ml *MultiLock) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return ml.acquire(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: after wait it releases whatever it
// took and returns ErrNotAcquired. wait 0 makes one attempt per slot; a
// negative wait is an error (ErrInvalid).
func (ml *MultiLock) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if wait < 0 {
		label := ""
		if ml != nil {
			label = ml.name
		}
		return ctx, checkWait(label, wait)
	}
	return ml.acquire(ctx, wait, opts)
}

// switchTo is what an attempt returns when a lock on another channel than
// the one waited on blocks it: the wait moves to that channel.
type switchTo struct{ channel string }

func (s *switchTo) Error() string { return "wait on " + s.channel }

func (ml *MultiLock) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := ml.usable(); err != nil {
		return ctx, err
	}
	lo := ml.c.lockOptions(opts)
	if err := startAcquire(ctx, ml.name, lo); err != nil {
		return ctx, err
	}
	// A lock ctx holds already is re-entered; the others are taken by an
	// acquisition of their own, under one new owner id. The semaphores are
	// taken in the global order too: two MultiLocks of one owner cannot
	// deadlock here either.
	p, err := enterParts(ctx, ml.name, ml.locks, nil, false)
	if err != nil {
		return ctx, err
	}
	defer p.exit()
	if err := p.stillCarried(); err != nil {
		return ctx, err
	}
	a := ml.newAcquisition(p.holds, lo, wait)
	if err := a.takeAll(ctx); err != nil {
		return ctx, err
	}
	a.adopt()
	return ml.enter(ctx, p.holds, p.carried, a.floor), nil
}

// A multiAcquisition is one acquisition of a MultiLock: its groups are taken
// one after the other, in the global order.
type multiAcquisition struct {
	ml       *MultiLock
	lo       lockOptions
	holds    []*hold          // by lock, in the order of ml.locks
	byKey    map[string]*hold // the same, by key
	floor    fencing.Token    // the largest token so far: the smallest the next group may issue
	wait     time.Duration    // as TryLock's, < 0 for Lock
	deadline time.Time        // when wait ends, if > 0
	tokens   []fencing.Token  // by group: the token each was taken with
	starts   []time.Time      // by group: when its last attempt was sent
	fresh    map[*hold]bool   // holds this acquisition took first, held from their group on
}

// newAcquisition returns an acquisition of the locks' holds with the
// options lo, within wait.
func (ml *MultiLock) newAcquisition(holds []*hold, lo lockOptions, wait time.Duration) *multiAcquisition {
	a := &multiAcquisition{
		ml: ml, lo: lo, holds: holds, wait: wait,
		byKey:  make(map[string]*hold, len(holds)),
		tokens: make([]fencing.Token, len(ml.groups)),
		starts: make([]time.Time, len(ml.groups)),
		fresh:  make(map[*hold]bool, len(holds)),
	}
	for i, h := range holds {
		a.byKey[ml.locks[i].key] = h
		if h.levels == 0 {
			h.prepare(ml.locks[i], lo)
		} else {
			a.floor = max(a.floor, h.token)
		}
	}
	if wait > 0 {
		a.deadline = time.Now().Add(wait)
	}
	return a
}

// takeAll takes every group of the set in order, checks that none of the
// locks it took was lost while a later group was waited for, and raises the
// counters of the groups taken before the last token. When it fails it has
// released what it took.
func (a *multiAcquisition) takeAll(ctx context.Context) error {
	ml := a.ml
	for gi := range ml.groups {
		if err := a.takeGroup(ctx, gi); err != nil {
			a.rollback(ctx, gi)
			return err
		}
	}
	// A lock lost while a later one was waited for (deleted, or a fixed
	// lease that ran out) fails the whole acquisition.
	for _, h := range a.holds {
		if a.fresh[h] && h.ctx.Err() != nil {
			a.rollback(ctx, len(ml.groups))
			return h.lostErr()
		}
	}
	if len(ml.groups) > 1 {
		if err := ml.raise(ctx, a.tokens, a.floor); err != nil {
			a.rollback(ctx, len(ml.groups))
			return failed(ctx, ml.name, err)
		}
	}
	return nil
}

// rollback releases what the acquisition took of its first n groups, which
// it had taken: the levels their script added and the locks it took (see
// MultiLock.rollback). A fixed hold the context carried keeps the lease the
// script extended it to (see keepStretched).
func (a *multiAcquisition) rollback(ctx context.Context, n int) {
	ml := a.ml
	ml.rollback(ctx, ml.groups[:n], a.byKey, a.fresh)
	for gi, g := range ml.groups[:n] {
		for _, m := range g {
			if h := a.byKey[m.key]; !a.fresh[h] {
				keepStretched(h, a.starts[gi], a.lo.lease)
			}
		}
	}
}

// takeGroup takes the group gi (the locks of one hash slot), all or none,
// waiting for it as the acquisition allows.
func (a *multiAcquisition) takeGroup(ctx context.Context, gi int) error {
	ml, g := a.ml, a.ml.groups[gi]
	gh := make([]*hold, len(g))
	for i, m := range g {
		gh[i] = a.byKey[m.key]
	}
	try := func(ctx context.Context) (bool, time.Duration, error) {
		a.starts[gi] = time.Now()
		ok, retry, t, err := ml.attempt(ctx, g, gh, a.floor, a.lo)
		if ok {
			a.tokens[gi] = t
			a.floor = max(a.floor, t)
		}
		return ok, retry, err
	}
	// Wait on the first lock of the group it does not hold yet. A group
	// it holds entirely is re-entered at once: queueing behind this
	// Client's own waiters for locks it holds would wait for itself.
	channel := ""
	for i, m := range g {
		if gh[i].levels == 0 {
			channel = m.unlockCh
			break
		}
	}
	var err error
	if channel == "" {
		var ok bool
		if ok, _, err = try(ctx); err == nil && !ok {
			err = notAcquired(ctx, ml.name)
		}
	} else {
		err = ml.waitGroup(ctx, g, channel, a.wait, a.deadline, gh[0].lease, try)
	}
	if err != nil {
		return err
	}
	// The group's new locks are held from now on, renewed by the watchdog
	// while the later groups are waited for: left alone they would expire
	// meanwhile and be taken by someone else.
	for _, h := range gh {
		if h.levels == 0 {
			h.token, h.top = a.tokens[gi], 0
			h.establish(ctx, a.starts[gi])
			a.fresh[h] = true
		}
	}
	return nil
}

// adopt ends an acquisition that took every group: the locks it took end
// with the context it was made with, the holds it re-entered are re-entered
// (see reenteredBy).
func (a *multiAcquisition) adopt() {
	i := 0
	for gi, g := range a.ml.groups {
		for range g {
			h := a.holds[i]
			i++
			if a.fresh[h] {
				h.tieToParent()
				continue
			}
			reenteredBy(h, a.starts[gi], a.lo.lease)
		}
	}
}

// attempt tries to take the locks g (one hash slot) once, all or none.
// A lock its context holds already is re-entered with the lease of lo (see
// reentryArg), the others are taken with their own.
func (ml *MultiLock) attempt(ctx context.Context, g []*Mutex, gh []*hold, floor fencing.Token, lo lockOptions) (bool, time.Duration, fencing.Token, error) {
	c, ack := ml.c, lo.ack
	start := time.Now()
	keys, args := multiAcquireArgs(c, g, gh, floor, lo.lease)
	var via processor = c.rdb
	var conn *redis.Conn
	if ack.replicas > 0 {
		var err error
		if conn, err = c.conn(ctx, g[0].key); err != nil {
			return false, 0, 0, ml.failed(ctx, err)
		}
		defer conn.Close()
		via = conn
	}
	args = append(args, c.tokenTTL) // last: see multi_acquire.lua
	vals, err := multiAcquireScript.run(ctx, via, keys, args...).Int64Slice()
	if err != nil {
		if outcomeUnknown(err) {
			ml.rollback(ctx, [][]*Mutex{g}, holdsByKey(g, gh), nil)
		}
		return false, 0, 0, ml.failed(ctx, err)
	}
	if len(vals) >= 2 && vals[0] == 1 {
		if conn != nil {
			if err := c.confirmReplicas(ctx, conn, ack); err != nil {
				ml.rollback(ctx, [][]*Mutex{g}, holdsByKey(g, gh), nil)
				for _, h := range gh {
					if h.levels > 0 {
						keepStretched(h, start, lo.lease) // a lock ctx carries
					}
				}
				return false, 0, 0, ml.failed(ctx, err)
			}
		}
		return true, 0, fencing.Token(vals[1]), nil
	}
	wait, err := ml.refused(g, gh, vals)
	return false, wait, 0, err
}

// multiAcquireArgs returns the keys and arguments of multi_acquire.lua for the
// locks g, whose holds are gh, all but the token expiry that ends them: the
// floor of the token, then per lock its field, the levels this process
// holds and the lease to set (a re-entry's, or the first acquisition's).
func multiAcquireArgs(c *engine, g []*Mutex, gh []*hold, floor fencing.Token, lease time.Duration) ([]string, []any) {
	keys := make([]string, 0, 2*len(g))
	args := make([]any, 0, 2+3*len(g))
	args = append(args, int64(floor))
	for i, m := range g {
		h := gh[i]
		var l any
		if h.levels > 0 {
			l = reentryArg(h, lease)
		} else {
			l, _ = c.leaseArgs(h)
		}
		keys = append(keys, m.keys...)
		args = append(args, h.field, h.levels, l)
	}
	return keys, args
}

// refused reads a reply of multi_acquire.lua that did not take the set g:
// a lock of it is held by another owner (wait for its unlock channel, at
// most the wait returned), or a hold this process re-entered is gone (it is
// lost). Any other reply is an error.
func (ml *MultiLock) refused(g []*Mutex, gh []*hold, vals []int64) (time.Duration, error) {
	if len(vals) == 3 && vals[2] >= 1 && int(vals[2]) <= len(g) {
		switch vals[0] {
		case 0:
			return retryAfter(ml.c.link, vals[1]), &switchTo{g[vals[2]-1].unlockCh}
		case -1:
			h := gh[vals[2]-1]
			h.lostBecause("its hold was gone when a MultiLock re-entered it")
			return 0, h.lostErr()
		}
	}
	return 0, wrap(ml.name, fmt.Errorf("unexpected reply %v from the multi acquire script", vals))
}

func (ml *MultiLock) failed(ctx context.Context, err error) error {
	return failed(ctx, ml.name, err)
}

func holdsByKey(g []*Mutex, gh []*hold) map[string]*hold {
	out := make(map[string]*hold, len(g))
	for i, m := range g {
		out[m.key] = gh[i]
	}
	return out
}

// waitGroup runs try until it takes the group g, waiting on the unlock
// channel of whichever lock of g blocks it, first on channel. lease is how
// long the locks it takes last unless renewed.
func (ml *MultiLock) waitGroup(ctx context.Context, g []*Mutex, channel string, wait time.Duration, deadline time.Time, lease time.Duration, try tryFunc) error {
	c := ml.c
	run := func(ctx context.Context) (bool, time.Duration, error) {
		ok, retry, err := try(ctx)
		var sw *switchTo
		if errors.As(err, &sw) {
			if sw.channel == channel {
				return false, retry, nil
			}
		}
		return ok, retry, err
	}
	for {
		left := wait
		if wait > 0 {
			if left = time.Until(deadline); left <= 0 {
				return notAcquired(ctx, ml.name)
			}
		}
		err := c.waitFor(ctx, waitSpec{name: ml.name, channel: channel, wait: left, lease: lease, try: run})
		var sw *switchTo
		if !errors.As(err, &sw) {
			return acquireErr(ctx, ml.name, err)
		}
		if wait == 0 {
			return notAcquired(ctx, ml.name)
		}
		channel = sw.channel
	}
}

// raise makes every token counter of the set at least t, so that the token
// of the MultiLock is valid for each of its locks.
func (ml *MultiLock) raise(ctx context.Context, tokens []fencing.Token, t fencing.Token) error {
	var calls []scriptCall
	for gi, g := range ml.groups {
		if tokens[gi] >= t {
			continue
		}
		keys := make([]string, len(g))
		for i, m := range g {
			keys[i] = m.keys[1]
		}
		calls = append(calls, scriptCall{raiseTokenScript, keys, []any{int64(t), ml.c.tokenTTL}})
	}
	if len(calls) == 0 {
		return nil
	}
	cmds, _ := ml.c.pipelined(calls, len(calls), func() (context.Context, context.CancelFunc) { return ctx, func() {} })
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return fmt.Errorf("raising the token counters: %w", err)
		}
	}
	return nil
}

// enter returns the context of an acquisition of the MultiLock whose locks'
// holds ctx now holds one more level of; carried marks those ctx held
// already.
func (ml *MultiLock) enter(ctx context.Context, holds []*hold, carried []bool, token fencing.Token) context.Context {
	key := multiKey{ml.c, ml.id}
	if mh, _ := ctx.Value(key).(*multiHold); mh != nil && mh.ctx.Err() == nil && mh.levels > 0 {
		mh.levels++
		return ctx
	}
	mh := &multiHold{compoundHold: compoundHold{levels: 1, token: token, holds: holds, carried: carried}}
	mctx := mh.begin(ctx)
	mh.watch(func(_ int, cause error) { ml.partEnded(mh, cause) })
	for i, h := range holds {
		if !carried[i] {
			mctx = context.WithValue(mctx, h.hk, h) // a Mutex of the name re-enters it
		}
	}
	return mh.publish(mctx, key, mh, func() { ml.parentEnded(mh) })
}

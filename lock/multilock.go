package lock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// A MultiLock holds several locks as one: "stock and balance together, or
// not at all". Its locks are plain Mutex locks of the given names (Redisson's
// RLock layout), so a MultiLock excludes, and re-enters, the Mutex of each
// of its names.
//
// All or none: Lock returns with every lock held, or with none of them held
// by this call. When all names live on one node (a single Redis or Sentinel
// deployment, or one Cluster slot, which hash tags such as "{order:7}:stock"
// and "{order:7}:balance" arrange) the whole set is taken and released by one
// script, so nobody ever observes part of it held. Across Cluster slots the
// set is taken slot by slot in one global order (by slot, then by key) that
// every MultiLock follows whatever order its names were given in, so two
// MultiLocks over the same names never deadlock; while it waits for a later
// slot it holds the earlier ones, renewed by the watchdog from the moment
// each is taken, and when it gives up (TryLock's wait, its context, an
// error) it releases them. If one of them is lost meanwhile (deleted, or a
// WithLease lease shorter than the wait ran out), Lock releases the rest
// and returns an error matching ErrLost.
//
// The context Lock returns carries one fencing token that is valid for every
// lock of the set: it is above every token issued before for any of them,
// and each lock's counter is raised to it, so every later token of any of
// them is above it. It is cancelled with cause ErrLost as soon as any of the
// locks is lost.
//
// A MultiLock is reentrant through its context like a Mutex. Names that
// appear twice are locked once. A MultiLock does no I/O until used and may
// be copied freely.
type MultiLock struct {
	handle            // name: the names as given, for errors
	locks  []*Mutex   // in the global order, without duplicates
	groups [][]*Mutex // locks that share a hash slot (one group unless Cluster)
	id     string     // the set's identity in contexts
}

// multiKey is the context key of a MultiLock's hold.
type multiKey struct {
	c  *Client
	id string
}

// A multiHold is one acquisition of a MultiLock and its re-entries.
type multiHold struct {
	compoundHold // guarded by the semaphores of its holds, as is done

	done map[string]bool // locks an Unlock in progress has released already (it failed on others)
}

// MultiLock returns the lock over all the names. It does no I/O; no names or
// an invalid name is reported by the first operation (ErrInvalid).
func (c *Client) MultiLock(names ...string) *MultiLock {
	ml := &MultiLock{handle: handle{c: c, name: strings.Join(names, ", ")}}
	switch {
	case c == nil:
		ml.checkErr = fmt.Errorf("%w: nil lock client", ErrInvalid)
		return ml
	case len(names) == 0:
		ml.checkErr = fmt.Errorf("%w: a MultiLock needs at least one lock name", ErrInvalid)
		return ml
	}
	seen := make(map[string]bool)
	full := make([]string, 0, len(names))
	for _, n := range names {
		m := newMutex(c, n)
		if m.checkErr != nil {
			ml.checkErr = m.checkErr
			return ml
		}
		full = append(full, m.key)
		if !seen[m.key] {
			seen[m.key] = true
			ml.locks = append(ml.locks, m)
		}
	}
	sort.Slice(ml.locks, func(i, j int) bool {
		si, sj := slot(ml.locks[i].key), slot(ml.locks[j].key)
		if si != sj {
			return si < sj
		}
		return ml.locks[i].key < ml.locks[j].key
	})
	keys := make([]string, len(ml.locks))
	for i, m := range ml.locks {
		keys[i] = m.key
		if i == 0 || (c.cluster && slot(m.key) != slot(ml.locks[i-1].key)) {
			ml.groups = append(ml.groups, nil)
		}
		ml.groups[len(ml.groups)-1] = append(ml.groups[len(ml.groups)-1], m)
	}
	ml.id = strings.Join(keys, "\x00")
	ml.name = strings.Join(full, ", ") // the full names, as given: errors and logs show them
	return ml
}

// Names returns the names of the locks in the order they are taken.
func (ml *MultiLock) Names() []string {
	if ml == nil {
		return nil
	}
	out := make([]string, len(ml.locks))
	for i, m := range ml.locks {
		out[i] = m.given
	}
	return out
}

func (ml *MultiLock) usable() error {
	if ml == nil {
		return fmt.Errorf("%w: nil multilock", ErrInvalid)
	}
	return ml.handle.usable()
}

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
	c := ml.c
	if ctx == nil {
		return ctx, noContext(ml.name)
	}
	lo := c.lockOptions(opts)
	if lo.err != nil {
		return ctx, wrap(ml.name, lo.err)
	}
	if ctxend.Ended(ctx) {
		return ctx, ctxErr(ml.name, ctx)
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
	holds, carried := p.holds, p.carried
	for i, h := range holds {
		if carried[i] && (h.levels == 0 || !c.holds.stillHeld(h)) {
			// Released or lost a moment ago: ctx ends with it.
			if c.holds.isLost(h) {
				return ctx, lostHold(h)
			}
			return ctx, wrap(h.name, ErrReleased)
		}
	}

	byKey := make(map[string]*hold, len(holds))
	var floor fencing.Token
	for i, h := range holds {
		byKey[ml.locks[i].key] = h
		if h.levels == 0 {
			h.prepare(ml.locks[i], lo)
		} else {
			floor = max(floor, h.token)
		}
	}

	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	tokens := make([]fencing.Token, len(ml.groups))
	starts := make([]time.Time, len(ml.groups))
	fresh := make(map[*hold]bool, len(holds)) // holds this acquisition took first, held from their group on
	for gi, g := range ml.groups {
		gh := make([]*hold, len(g))
		for i, m := range g {
			gh[i] = byKey[m.key]
		}
		try := func(ctx context.Context) (bool, time.Duration, error) {
			starts[gi] = time.Now()
			ok, retry, t, err := ml.attempt(ctx, g, gh, floor, lo.ack)
			if ok {
				tokens[gi] = t
				floor = max(floor, t)
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
			err = ml.waitGroup(ctx, g, channel, wait, deadline, gh[0].lease, try)
		}
		if err != nil {
			ml.rollback(ctx, ml.groups[:gi], byKey, fresh)
			return ctx, err
		}
		// The group's new locks are held from now on, renewed by the
		// watchdog while the later groups are waited for: left alone
		// they would expire meanwhile and be taken by someone else.
		for _, h := range gh {
			if h.levels == 0 {
				h.token, h.top = tokens[gi], 0
				c.establish(ctx, h, starts[gi])
				fresh[h] = true
			}
		}
	}
	// A lock lost while a later one was waited for (deleted, or a fixed
	// lease that ran out) fails the whole acquisition.
	for _, h := range holds {
		if fresh[h] && h.ctx.Err() != nil {
			ml.rollback(ctx, ml.groups, byKey, fresh)
			return ctx, lostHold(h)
		}
	}

	// Raise the counters of the slots taken before the last token.
	if len(ml.groups) > 1 {
		if err := ml.raise(ctx, tokens, floor); err != nil {
			ml.rollback(ctx, ml.groups, byKey, fresh)
			return ctx, failed(ctx, ml.name, err)
		}
	}

	i := 0
	for gi, g := range ml.groups {
		for range g {
			h := holds[i]
			i++
			if fresh[h] {
				h.tieToParent()
				continue
			}
			h.reentered(starts[gi])
			// The lock's counter is at the MultiLock's token now, above
			// the tokens h reserved for handing its lock over.
			h.top = h.token
		}
	}
	return ml.enter(ctx, holds, carried, floor), nil
}

// attempt tries to take the locks g (one hash slot) once, all or none.
func (ml *MultiLock) attempt(ctx context.Context, g []*Mutex, gh []*hold, floor fencing.Token, ack replicaAck) (bool, time.Duration, fencing.Token, error) {
	c := ml.c
	keys := make([]string, 0, 2*len(g))
	args := make([]any, 0, 1+3*len(g))
	args = append(args, int64(floor))
	for i, m := range g {
		h := gh[i]
		lease, again := c.leaseArgs(h) // again: a fixed lease keeps its deadline
		if h.levels > 0 {
			lease = again
		}
		keys = append(keys, m.keys...)
		args = append(args, h.field, h.levels, lease)
	}
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
	if len(vals) >= 2 {
		switch vals[0] {
		case 1:
			if conn != nil {
				if err := c.confirmReplicas(ctx, conn, ack); err != nil {
					ml.rollback(ctx, [][]*Mutex{g}, holdsByKey(g, gh), nil)
					return false, 0, 0, ml.failed(ctx, err)
				}
			}
			return true, 0, fencing.Token(vals[1]), nil
		case 0:
			if len(vals) == 3 && vals[2] >= 1 && int(vals[2]) <= len(g) {
				return false, retryAfter(c, vals[1]), 0, &switchTo{g[vals[2]-1].unlockCh}
			}
		case -1:
			if len(vals) == 3 && vals[2] >= 1 && int(vals[2]) <= len(g) {
				h := gh[vals[2]-1]
				if c.holds.lose(h) {
					h.end(lostError(h.name, "its hold was gone when a MultiLock re-entered it"))
				}
				return false, 0, 0, lostHold(h)
			}
		}
	}
	return false, 0, 0, wrap(ml.name, fmt.Errorf("unexpected reply %v from the multi acquire script", vals))
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
func (ml *MultiLock) waitGroup(ctx context.Context, g []*Mutex, channel string, wait time.Duration, deadline time.Time, lease time.Duration, try attempt) error {
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
			return err
		}
		if wait == 0 {
			return notAcquired(ctx, ml.name)
		}
		channel = sw.channel
	}
}

// rollback releases the level this acquisition added to each lock of
// groups, which it had taken (or may have taken), slot by slot. The holds in
// fresh, which it had established, are released in the Client whatever
// Redis answers: what the script could not remove expires with its lease.
func (ml *MultiLock) rollback(ctx context.Context, groups [][]*Mutex, byKey map[string]*hold, fresh map[*hold]bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	for _, g := range groups {
		keys := make([]string, 0, 2*len(g))
		args := []any{ml.c.publish}
		for _, m := range g {
			h := byKey[m.key]
			if fresh[h] {
				// No renewal may follow the release.
				ml.c.dog.remove(&h.renewal)
			}
			keys = append(keys, m.relKeys...)
			if fresh[h] {
				args = append(args, h.field, 1)
			} else {
				args = append(args, h.field, h.levels+1)
			}
		}
		if err := ml.c.run(rctx, multiReleaseScript, keys, args...).Err(); err != nil {
			ml.c.opts.logger.WarnContext(ctx, "lock: could not roll back part of a MultiLock; it expires with its lease",
				"locks", ml.name, "err", err)
		}
		for _, m := range g {
			if h := byKey[m.key]; fresh[h] {
				ml.c.released(h)
			}
		}
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
	mh.watch(func(_ int, cause error) { mh.cancel(cause) })
	for i, h := range holds {
		if !carried[i] {
			mctx = context.WithValue(mctx, h.hk, h) // a Mutex of the name re-enters it
		}
	}
	return mh.publish(mctx, key, mh, func() { ml.parentEnded(mh) })
}

// parentEnded ends the acquisition mh of the MultiLock because the context
// it was taken with ended (see endWithParent).
func (ml *MultiLock) parentEnded(mh *multiHold) {
	enterAll(mh.holds)
	defer exitAll(mh.holds)
	ml.endWithParent(mh)
}

// endWithParent releases what is left of the acquisition mh, whose context
// ended, as its final Unlocks would: the locks it took release themselves
// (tieToParent); the levels it added to locks that context held already are
// released here. The caller holds the semaphores of mh's holds.
func (ml *MultiLock) endWithParent(mh *multiHold) {
	c := ml.c
	n := mh.levels
	if n == 0 {
		return
	}
	mh.levels, mh.done, mh.ended, mh.stopLife = 0, nil, true, nil
	for i, h := range mh.holds {
		// Each carried hold has n levels of this acquisition: every one of
		// them goes.
		for k := n; k > 0 && mh.carried[i] && h.levels > 0 && c.holds.stillHeld(h); k-- {
			ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
			err := c.releaseLevel(ctx, h)
			cancel()
			if err != nil && !errors.Is(err, ErrLost) && h.levels > 1 && c.holds.stillHeld(h) {
				// Nobody calls again for this level: let go of it here. Its
				// count in Redis may stay one above, which is harmless: the
				// final release removes the owner whatever the count (and a
				// failed final release is retried by releaseLater).
				h.levels--
				c.opts.logger.DebugContext(mh.parent, "lock: releasing a MultiLock's level of a hold it re-entered failed; the final release removes it",
					"lock", h.name, "err", err)
			}
		}
	}
	mh.stopParts()
	mh.cancel(context.Cause(mh.parent))
}

// Unlock releases one level of every lock of the set held by ctx, slot by
// slot (all at once within a slot). The final Unlock of an acquisition
// cancels its context with cause ErrReleased. It returns ErrNotHeld, and
// changes nothing, when ctx does not hold the MultiLock, and an error
// matching ErrLost when one of its locks was lost (the others are released
// all the same). When Unlock fails with a network error it may be called
// again: a level is never released twice.
func (ml *MultiLock) Unlock(ctx context.Context) error {
	if err := ml.usable(); err != nil {
		return err
	}
	c := ml.c
	if ctx == nil {
		return noContext(ml.name)
	}
	mh, _ := ctx.Value(multiKey{c, ml.id}).(*multiHold)
	if mh == nil {
		if errors.Is(context.Cause(ctx), ErrLost) {
			return wrap(ml.name, ErrLost)
		}
		return wrap(ml.name, ErrNotHeld)
	}
	holds := mh.holds
	enterAll(holds)
	defer exitAll(holds)
	if mh.levels > 0 && mh.parent.Err() != nil {
		ml.endWithParent(mh) // its context ended: it is released by now, or here
	}
	if mh.levels == 0 {
		if mh.ended {
			return nil // released when the context it was taken with ended
		}
		if errors.Is(context.Cause(mh.ctx), ErrLost) {
			return context.Cause(mh.ctx)
		}
		return wrap(ml.name, ErrNotHeld)
	}

	var errs []error
	i := 0
	for _, g := range ml.groups {
		gh := holds[i : i+len(g)]
		i += len(g)
		keys := make([]string, 0, 2*len(g))
		args := []any{c.publish}
		renewed := make([]bool, len(g))
		var live []int
		for j, m := range g {
			h := gh[j]
			if mh.done[m.key] {
				continue
			}
			if h.levels == 0 && !c.holds.isLost(h) && errors.Is(context.Cause(h.ctx), errReleasedLater) {
				// An earlier Unlock failed on it and the retry in the
				// background released it since.
				continue
			}
			if h.levels == 0 || c.holds.isLost(h) {
				errs = append(errs, wrap(h.name, ErrLost))
				continue
			}
			renewed[j] = c.releasing(h)
			keys = append(keys, m.relKeys...)
			args = append(args, h.field, h.levels)
			live = append(live, j)
		}
		if len(live) == 0 {
			continue
		}
		left, err := c.run(context.WithoutCancel(ctx), multiReleaseScript, keys, args...).Int64Slice()
		for n, j := range live {
			var l int64
			if err == nil && n < len(left) {
				l = left[n]
			} else if err == nil {
				err = fmt.Errorf("unexpected reply %v from the multi release script", left)
			}
			e := c.settle(gh[j], renewed[j], l, err)
			if e != nil {
				errs = append(errs, e)
			}
			if e == nil || errors.Is(e, ErrLost) {
				if mh.done == nil {
					mh.done = make(map[string]bool)
				}
				mh.done[g[j].key] = true
			}
		}
	}
	if len(errs) > 0 && !allLost(errs) {
		return errors.Join(errs...) // a network error: the caller may retry
	}
	mh.levels--
	mh.done = nil
	if mh.levels == 0 {
		mh.stopWatching()
		mh.cancel(wrap(ml.name, ErrReleased))
		if cause := context.Cause(mh.ctx); len(errs) == 0 && errors.Is(cause, ErrLost) {
			return cause
		}
	}
	return errors.Join(errs...)
}

// allLost reports whether every error is a loss (nothing to retry).
func allLost(errs []error) bool {
	for _, e := range errs {
		if !errors.Is(e, ErrLost) {
			return false
		}
	}
	return true
}

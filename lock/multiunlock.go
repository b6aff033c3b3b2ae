package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The release side of a MultiLock: its Unlock, slot by slot; the release of
// an acquisition whose context ended; the rollback of an acquisition that
// failed.

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
	n := mh.levels
	if n == 0 {
		return
	}
	mh.levels, mh.done, mh.ended, mh.stopLife = 0, nil, true, nil
	for i, h := range mh.holds {
		if mh.carried[i] {
			endCarried(h, n) // each carried hold has n levels of this acquisition: every one of them goes
		}
	}
	mh.stopParts()
	mh.cancel(context.Cause(mh.parent))
}

// partEnded ends the acquisition mh of the MultiLock because the context of
// one of its parts' holds ended with cause. A part lost (cause matches
// ErrLost) loses the whole set: mh's context ends with that cause, and the
// parts that survive are released at once, as the end of the context it was
// taken with would release them (see endLost), so that their names are free
// for others without waiting for the caller's Unlock.
func (ml *MultiLock) partEnded(mh *multiHold, cause error) {
	mh.cancel(cause)
	if !errors.Is(cause, ErrLost) {
		return // released, or the context it was taken with ended: see Unlock, parentEnded
	}
	enterAll(mh.holds)
	defer exitAll(mh.holds)
	ml.endLost(mh)
}

// endLost releases what is left of the acquisition mh, which lost one of
// its parts: the locks it took are released whatever their count, and the
// levels it added to locks its context held already are released (see
// endCarried). Its Unlock then answers with the loss. The caller holds the
// semaphores of mh's holds.
func (ml *MultiLock) endLost(mh *multiHold) {
	n := mh.levels
	if n == 0 {
		return
	}
	mh.levels, mh.done = 0, nil
	mh.stopWatching()
	for i, h := range mh.holds {
		if mh.carried[i] {
			endCarried(h, n)
		} else {
			releaseTaken(h)
		}
	}
}

// releaseTaken releases h, a hold a compound lock took for itself, whatever
// its count, because the compound lock was lost: as the end of the context
// it was taken with would (h.parentEnded). A release that fails is retried
// until its lease ends. The caller holds h's semaphore.
func releaseTaken(h *hold) {
	c := h.c
	if h.levels == 0 || !h.held() {
		return
	}
	h.ended = true
	h.levels = 1 // the last level's release removes the owner whatever its count
	ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
	defer cancel()
	if err := c.releaseLevel(ctx, h); err != nil && !errors.Is(err, ErrLost) {
		c.opts.logger.DebugContext(h.logContext(ctx), "lock: releasing a part of a lost compound lock failed; retried until its lease ends",
			"lock", h.name, "err", err)
	}
}

// Unlock releases one level of every lock of the set held by ctx, slot by
// slot (all at once within a slot). The final Unlock of an acquisition
// cancels its context with cause ErrReleased. It returns ErrNotHeld, and
// changes nothing, when ctx does not hold the MultiLock, and an error
// matching ErrLost when one of its locks was lost (the others were
// released when it was). When Unlock fails with a network error it may be
// called again: a level is never released twice.
func (ml *MultiLock) Unlock(ctx context.Context) error {
	if err := ml.usable(); err != nil {
		return err
	}
	mh, err := heldCompound[*multiHold](ctx, multiKey{ml.c, ml.id}, ml.name)
	if err != nil {
		return err
	}
	holds := mh.holds
	enterAll(holds)
	defer exitAll(holds)
	if mh.levels > 0 && mh.parent.Err() != nil {
		ml.endWithParent(mh) // its context ended: it is released by now, or here
	}
	if mh.levels == 0 {
		return ml.notHeld(mh)
	}
	var errs []error
	i := 0
	for _, g := range ml.groups {
		errs = append(errs, ml.releaseGroup(ctx, mh, g, holds[i:i+len(g)])...)
		i += len(g)
	}
	if len(errs) > 0 && !allLost(errs) {
		return errors.Join(errs...) // a network error: the caller may retry
	}
	mh.levels--
	mh.done = nil
	if mh.levels == 0 {
		mh.stopWatching()
		if err := mh.released(ml.name); len(errs) == 0 && err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// notHeld is the error of an Unlock of the acquisition mh, which has no
// level left: nil when it was released because the context it was taken
// with ended, its loss when it was lost, else ErrNotHeld.
func (ml *MultiLock) notHeld(mh *multiHold) error {
	if mh.ended {
		return nil // released when the context it was taken with ended
	}
	if cause := context.Cause(mh.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return wrap(ml.name, ErrNotHeld)
}

// releaseGroup releases one level of each lock of the group g (one hash
// slot), whose holds are gh, in one script call, for an Unlock of mh with
// ctx, and returns its errors. A lock an earlier try of this Unlock
// released already is skipped (mh.done), as is one whose failed final
// release the background retry completed since; a lock lost is an error
// matching ErrLost.
func (ml *MultiLock) releaseGroup(ctx context.Context, mh *multiHold, g []*Mutex, gh []*hold) []error {
	c := ml.c
	var errs []error
	keys := make([]string, 0, 2*len(g))
	args := []any{c.publish}
	renewed := make([]bool, len(g))
	var live []int
	for j, m := range g {
		h := gh[j]
		switch {
		case mh.done[m.key]:
			continue
		case h.levels == 0 && !h.isLost() && (h.releasedLater || errors.Is(context.Cause(h.ctx), errReleasedLater)):
			continue // an earlier Unlock failed on it and the retry in the background released it since
		case h.levels == 0 || h.isLost():
			errs = append(errs, wrap(h.name, ErrLost))
			continue
		}
		renewed[j] = c.releasing(h)
		keys = append(keys, m.relKeys...)
		args = append(args, h.field, h.levels)
		live = append(live, j)
	}
	if len(live) == 0 {
		return errs
	}
	left, err := c.run(context.WithoutCancel(ctx), multiReleaseScript, keys, args...).Int64Slice()
	for n, j := range live {
		if e := ml.settleLock(mh, g[j], gh[j], renewed[j], n, left, err); e != nil {
			errs = append(errs, e)
		}
	}
	return errs
}

// settleLock records the outcome of the release of m's level, the n-th of
// a multi release script call that answered left and err, for an Unlock of
// mh; renewed is what releasing returned. A lock released (or found lost)
// is marked done, so that a retry of the Unlock skips it.
func (ml *MultiLock) settleLock(mh *multiHold, m *Mutex, h *hold, renewed bool, n int, left []int64, err error) error {
	var l int64
	if err == nil && n < len(left) {
		l = left[n]
	} else if err == nil {
		err = fmt.Errorf("unexpected reply %v from the multi release script", left)
	}
	e := ml.c.settle(h, renewed, l, err)
	if e == nil || errors.Is(e, ErrLost) {
		if mh.done == nil {
			mh.done = make(map[string]bool)
		}
		mh.done[m.key] = true
	}
	return e
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

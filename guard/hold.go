package guard

import (
	"context"
	"errors"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/lock"
)

// A hold is one hold of a route's lock: by the lock step, around its
// request's handler, or by a combining batch's leader, around its batch.
// Both take and release it the same way (takeLock, release): the TryLock as
// StepLock, the metrics, the unlock, and the log lines of a lost lock and of
// a long hold.
type hold struct {
	g             *Guard
	mu            *lock.Mutex
	ctx           context.Context // the hold's lock context
	log           context.Context // the request's, for the log lines
	key           string
	method, route string
	longHold      time.Duration
	heldAt        time.Time
	batch         bool // a batch's hold: its log lines say so
}

// takeLock takes the lock named key for c's request as StepLock: take makes
// the attempt (the lock step takes the lock with the request's context, a
// batch's leader with one of its own that outlives the request). ok is false
// when the lock was not taken: the request is answered then (busy,
// unavailable, the client gone), or, on a FailOpen route whose Redis is
// down, failOpen ran.
func (g *Guard) takeLock(c *gin.Context, r *route, key string, batch bool, take func(*lock.Mutex) (context.Context, error), failOpen func()) (h hold, ok bool) {
	method, routeName := routeOf(c)
	mu := g.locks.Mutex(key)
	reqCtx := c.Request.Context()
	_, endStep := g.step(reqCtx, c, StepLock, key)
	start := time.Now()
	ctx, err := take(mu)
	if err != nil {
		g.lockFailed(c, r, method, routeName, key, err, time.Since(start), endStep, failOpen)
		return hold{}, false
	}
	heldAt := time.Now()
	tok, _ := fencing.FromContext(ctx)
	endStep(StepResult{Outcome: OutcomeAcquired, Wait: heldAt.Sub(start), Token: tok})
	g.metrics.acquired.WithLabelValues(method, routeName).Inc()
	g.metrics.wait.WithLabelValues(method, routeName).Observe(heldAt.Sub(start).Seconds())
	return hold{g: g, mu: mu, ctx: ctx, log: reqCtx, key: key, method: method, route: routeName,
		longHold: r.longHold, heldAt: heldAt, batch: batch}, true
}

// release lets the lock go, and says so when it was lost or held long.
func (h *hold) release() {
	g := h.g
	held := time.Since(h.heldAt)
	uerr := h.mu.Unlock(h.ctx)
	g.metrics.hold.WithLabelValues(h.method, h.route).Observe(held.Seconds())
	switch {
	case Lost(h.ctx) || errors.Is(uerr, lock.ErrLost):
		g.metrics.lost.WithLabelValues(h.method, h.route).Inc()
		msg := "guard: lock lost while the handler ran; its fenced writes were refused"
		if h.batch {
			msg = "guard: lock lost while a batch ran; its fenced writes were refused"
		}
		g.log.WarnContext(h.log, msg, "route", h.route, "key", g.locks.Key(h.key), "held", held, "cause", context.Cause(h.ctx))
	case uerr != nil:
		g.log.ErrorContext(h.log, "guard: unlock failed; it is retried in the background until the lock's lease ends",
			"route", h.route, "key", g.locks.Key(h.key), "err", uerr)
	}
	if held > h.longHold {
		msg := "guard: lock held longer than the threshold; keep remote calls out of the critical section"
		if h.batch {
			msg = "guard: lock held longer than the threshold by a batch; keep remote calls out of the critical section, or lower MaxBatchTime"
		}
		g.log.WarnContext(h.log, msg, "route", h.route, "key", g.locks.Key(h.key), "held", held, "threshold", h.longHold)
	}
}

// lockFailed answers a request whose lock was not taken; endStep ends its
// StepLock, which took wait. On a FailOpen route whose Redis is down it runs
// failOpen instead.
func (g *Guard) lockFailed(c *gin.Context, r *route, method, routeName, key string, err error, wait time.Duration, endStep func(StepResult), failOpen func()) {
	res := StepResult{Wait: wait, Err: err}
	switch {
	case c.Request.Context().Err() != nil:
		// The client gave up while waiting; nobody reads this answer.
		res.Outcome = OutcomeCancelled
		endStep(res)
		abort(c, answerClientGone, r.retryAfter)
	case errors.Is(err, lock.ErrNotAcquired):
		res.Outcome = OutcomeBusy
		endStep(res)
		g.metrics.busy.WithLabelValues(method, routeName).Inc()
		abortBusy(c, r)
	case errors.Is(err, lock.ErrInvalid):
		res.Outcome = OutcomeInvalid
		endStep(res)
		g.log.ErrorContext(c.Request.Context(), "guard: the lock refused the request's key or the Guard's configuration", "route", routeName, "key", g.locks.Key(key), "err", err)
		_ = c.Error(err)
		abort(c, answerInternal, r.retryAfter)
	case r.failOpen && errors.Is(err, lock.ErrUnavailable):
		res.Outcome = OutcomeFailOpen
		endStep(res)
		g.metrics.redisDown.WithLabelValues(method, routeName, "open").Inc()
		g.log.WarnContext(c.Request.Context(), "guard: lock unavailable; the route fails open and runs unprotected", "route", routeName, "key", g.locks.Key(key), "err", err)
		failOpen()
	default:
		// Redis unreachable (lock.ErrUnavailable), or a lock that cannot
		// serve for another reason (its Client closed while the service
		// shuts down, too few replicas): never contention, and a route
		// fails open only for an outage of Redis itself.
		res.Outcome = OutcomeUnavailable
		endStep(res)
		g.metrics.redisDown.WithLabelValues(method, routeName, "closed").Inc()
		g.log.ErrorContext(c.Request.Context(), "guard: lock unavailable", "route", routeName, "key", g.locks.Key(key), "err", err)
		_ = c.Error(err)
		abort(c, answerLockDown, r.retryAfter)
	}
}

// takeBeyond takes, with take, what must outlive the request whose context
// is req (a batch's lock, a key's permit): it is taken with a context of its
// own, derived from own (which never ends: context.Background, or
// context.WithoutCancel(req) to keep the request's values for the lock's
// log lines), that req ending cancels only while take waits. When req ends
// just as take succeeds, release gives back what was taken, and the error
// is req's cause: the request is answered as one whose client went away.
func takeBeyond(req, own context.Context, take func(context.Context) (context.Context, error), release func(context.Context)) (context.Context, error) {
	ctx, cancel := context.WithCancelCause(own)
	stop := context.AfterFunc(req, func() { cancel(context.Cause(req)) })
	got, err := take(ctx)
	if !stop() && err == nil {
		release(got)
		return nil, context.Cause(req)
	}
	if err != nil {
		cancel(nil)
	}
	return got, err
}

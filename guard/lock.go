package guard

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
)

// StatusClientClosedRequest is the status recorded for a request whose
// client went away while it waited (nginx's 499); nobody receives it.
const StatusClientClosedRequest = 499

// A step is one middleware, written so that steps compose inside a single
// gin handler (a policy may run idempotency, then the lock, then the route).
type step func(c *gin.Context, next func())

// handler turns s into a gin middleware.
func (s step) handler() gin.HandlerFunc {
	return func(c *gin.Context) { s(c, c.Next) }
}

// Lock returns middleware that holds the distributed lock named by template
// around the rest of the chain. template is literal text with <field>
// placeholders filled from the request ("sku:<id>", "order:<ctx:user_id>");
// see package ginmw for the sources. It panics on a malformed template.
//
// Answers (all JSON {"error": ...}):
//
//	400 a key field is missing or unsafe       413 the body is over BodyLimit
//	429 the key stayed locked for the wait     503 Redis is unreachable (unless FailOpen)
//	409 the handler's write was refused as stale ("stale_write") or the lock was
//	    lost while it ran ("lock_lost"), if the handler wrote no answer itself
//
// The handler runs with the lock's context as its request context: pass
// c.Request.Context() to the database (db.WithContext) so writes carry the
// fencing token; it is cancelled with cause lock.ErrLost if the lock is
// lost. The lock is released when the handler returns or panics. A handler
// that reports an error with c.Error(err) where errors.Is(err,
// fencing.ErrStale) is answered 409.
func (g *Guard) Lock(template string, opts ...RouteOption) gin.HandlerFunc {
	return g.lockStep(ginmw.MustParseTemplate(template), g.mustRoute(opts, useLock)).handler()
}

func (g *Guard) lockStep(tmpl *ginmw.Template, r route) step {
	var lockOpts []lock.LockOption
	if r.lease > 0 {
		lockOpts = append(lockOpts, lock.WithLease(r.lease))
	}
	return func(c *gin.Context, next func()) {
		method, routeName := routeOf(c)
		key, err := tmpl.Resolve(c, r.bodyLimit)
		if err != nil {
			g.reject(c, method, routeName, err)
			return
		}
		m := g.locks.Mutex(key)
		reqCtx := c.Request.Context()
		start := time.Now()
		ctx, err := m.TryLock(reqCtx, r.wait, lockOpts...)
		if err != nil {
			g.lockFailed(c, r, method, routeName, key, err, next)
			return
		}
		heldAt := time.Now()
		g.metrics.acquired.WithLabelValues(method, routeName).Inc()
		g.metrics.wait.WithLabelValues(method, routeName).Observe(heldAt.Sub(start).Seconds())

		orig := c.Request
		c.Request = orig.WithContext(ctx)
		c.Set(lockKeyName, key)
		defer func() {
			// Runs when the handler returns and when it panics.
			c.Request = orig
			held := time.Since(heldAt)
			uerr := m.Unlock(ctx)
			g.metrics.hold.WithLabelValues(method, routeName).Observe(held.Seconds())
			switch {
			case Lost(ctx) || errors.Is(uerr, lock.ErrLost):
				g.metrics.lost.WithLabelValues(method, routeName).Inc()
				g.log.Warn("guard: lock lost while the handler ran; its fenced writes were refused",
					"route", routeName, "key", key, "held", held, "cause", context.Cause(ctx))
			case uerr != nil:
				g.log.Error("guard: unlock failed; it is retried in the background until the lock's lease ends", "route", routeName, "key", key, "err", uerr)
			}
			if held > r.longHold {
				g.log.Warn("guard: lock held longer than the threshold; keep remote calls out of the critical section",
					"route", routeName, "key", key, "held", held, "threshold", r.longHold)
			}
		}()
		next()
		g.afterHandler(c, ctx, method, routeName)
	}
}

// lockFailed answers a request whose lock was not acquired.
func (g *Guard) lockFailed(c *gin.Context, r route, method, routeName, key string, err error, next func()) {
	switch {
	case c.Request.Context().Err() != nil:
		// The client gave up while waiting; nobody reads this answer.
		answeredByFramework(c)
		c.AbortWithStatus(StatusClientClosedRequest)
	case errors.Is(err, lock.ErrNotAcquired):
		answeredByFramework(c)
		g.metrics.busy.WithLabelValues(method, routeName).Inc()
		ginmw.Abort(c, r.busyStatus, r.busyCode, ginmw.RetryAfter(r.retryAfter))
	case errors.Is(err, lock.ErrInvalid):
		answeredByFramework(c)
		g.log.Error("guard: the lock refused the request's key or the Guard's configuration", "route", routeName, "key", key, "err", err)
		ginmw.AbortError(c, err)
	case r.failOpen:
		g.metrics.redisDown.WithLabelValues(method, routeName, "open").Inc()
		g.log.Warn("guard: lock unavailable; the route fails open and runs unprotected", "route", routeName, "key", key, "err", err)
		next()
	default:
		answeredByFramework(c)
		g.metrics.redisDown.WithLabelValues(method, routeName, "closed").Inc()
		g.log.Error("guard: lock unavailable", "route", routeName, "key", key, "err", err)
		_ = c.Error(err)
		ginmw.Abort(c, http.StatusServiceUnavailable, "lock_unavailable", ginmw.RetryAfter(r.retryAfter))
	}
}

// afterHandler answers 409 for a handler that hit a stale write or lost its
// lock and wrote nothing itself, and counts stale writes.
func (g *Guard) afterHandler(c *gin.Context, ctx context.Context, method, routeName string) {
	stale := false
	for _, e := range c.Errors {
		if errors.Is(e.Err, fencing.ErrStale) {
			stale = true
			break
		}
	}
	if stale {
		g.metrics.stale.WithLabelValues(method, routeName).Inc()
	}
	if stale || Lost(ctx) {
		// Whatever the answer, the work did not happen as the client asked:
		// an idempotency record must not make a retry replay it.
		c.Set(unrepeatableName, true)
	}
	if c.Writer.Written() {
		return
	}
	switch {
	case stale:
		ginmw.Abort(c, http.StatusConflict, "stale_write")
	case Lost(ctx):
		ginmw.Abort(c, http.StatusConflict, "lock_lost")
	}
}

// reject answers a request that cannot be guarded (bad key field, body).
func (g *Guard) reject(c *gin.Context, method, routeName string, err error) {
	answeredByFramework(c)
	g.metrics.rejected.WithLabelValues(method, routeName, errorCode(err)).Inc()
	ginmw.AbortError(c, err)
}

// errorCode names err for the rejected_total metric.
func errorCode(err error) string {
	switch {
	case errors.Is(err, ginmw.ErrBodyTooLarge):
		return "body_too_large"
	case errors.Is(err, ginmw.ErrMissingField):
		return "missing_field"
	case errors.Is(err, ginmw.ErrUnsafeValue):
		return "unsafe_value"
	case errors.Is(err, ginmw.ErrBadBody):
		return "bad_body"
	case errors.Is(err, errIdemKey):
		return "idempotency_key"
	}
	return "internal"
}

func isLost(err error) bool { return errors.Is(err, lock.ErrLost) }

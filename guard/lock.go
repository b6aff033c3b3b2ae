package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
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

// handler turns s into a gin middleware that answers through g's
// Renderer.
func (g *Guard) handler(s step) gin.HandlerFunc {
	return func(c *gin.Context) {
		g.metrics.touch(routeOf(c))
		if g.render != nil {
			ginmw.SetRenderer(c, g.render)
		}
		s(c, c.Next)
	}
}

// Lock returns middleware that holds the distributed lock named by template
// around the rest of the chain. template is literal text with <field>
// placeholders filled from the request ("sku:<id>", "order:<ctx:user_id>");
// see package ginmw for the sources. It panics on a malformed template and
// on a refused option (see RouteOption).
//
// Lock is used the same way router-wide (r.Use), on a group and on one
// route; which routes it locks follows from the template and the route's
// path (c.FullPath()):
//   - a <x> field (no source) names the path parameter :x; a route without
//     it, and an unknown route, pass through untouched, so that
//     r.Use(guard.Lock("sku:<id>")) locks the routes that have :id and
//     leaves /healthz alone. Write <query:x> or <body:x> for a field of the
//     query or the body.
//   - a <path:x> field demands :x: on a route without it the request is
//     answered 500 "lock_route_mismatch" (ErrRouteMismatch), and the first
//     such request of each route is logged as an error.
//
// Before it takes the lock, Lock reads the request body whole (up to
// BodyLimit, within BodyTimeout), so that the handler reads it from memory
// and a client sending it slowly never holds the lock.
//
// Answers (all JSON {"error": ...}):
//
//	400 a key field is missing or unsafe       413 the body is over BodyLimit
//	408 the body did not arrive in BodyTimeout 500 the template does not fit the route
//	429 the key stayed locked for the wait     503 Redis is unreachable (unless FailOpen)
//	409 the handler's write was refused as stale ("stale_write") or the lock was
//	    lost while it ran ("lock_lost"), if the handler wrote no answer itself
//
// The handler runs with the lock's context as its request context: pass
// it to the database (db.WithContext(c.Request.Context()), or the Gin idiom
// db.WithContext(c)) so writes carry the fencing token; it is cancelled
// with cause lock.ErrLost if the lock is lost. With db.WithContext(c) the
// token is found whatever the engine's ContextWithFallback: Lock publishes
// its context under fencing.ContextKey, which gormplugin looks up; only
// with ContextWithFallback set, or with c.Request.Context(), does the
// database driver also abandon a query when the lock is lost. The lock is released when the handler returns or panics. A handler
// that reports an error with c.Error(err) where errors.Is(err,
// fencing.ErrStale) is answered 409.
func (g *Guard) Lock(template string, opts ...RouteOption) gin.HandlerFunc {
	return g.handler(g.lockStep(ginmw.MustParseTemplate(template), g.mustRoute(opts, useLock)))
}

func (g *Guard) lockStep(tmpl *ginmw.Template, r route) step {
	if r.session != nil {
		return g.combineStep(tmpl, r)
	}
	var lockOpts []lock.LockOption
	if r.lease > 0 {
		lockOpts = append(lockOpts, lock.WithLease(r.lease))
	}
	fits := &routeFits{tmpl: tmpl, log: g.log}
	return func(c *gin.Context, next func()) {
		key, ok := g.prepareLock(c, fits, tmpl, r, next)
		if !ok {
			return
		}
		method, routeName := routeOf(c)
		m := g.locks.Mutex(key)
		reqCtx := c.Request.Context()
		_, endStep := g.step(reqCtx, c, StepLock, key)
		start := time.Now()
		ctx, err := m.TryLock(reqCtx, r.wait, lockOpts...)
		if err != nil {
			g.lockFailed(c, r, method, routeName, key, err, time.Since(start), endStep, next)
			return
		}
		heldAt := time.Now()
		tok, _ := fencing.FromContext(ctx)
		endStep(StepResult{Outcome: OutcomeAcquired, Wait: heldAt.Sub(start), Token: tok})
		g.metrics.acquired.WithLabelValues(method, routeName).Inc()
		g.metrics.wait.WithLabelValues(method, routeName).Observe(heldAt.Sub(start).Seconds())

		orig := c.Request
		c.Request = orig.WithContext(ctx)
		c.Set(lockKeyName, key)
		// db.WithContext(c) with the *gin.Context itself finds the token
		// there, whatever the engine's ContextWithFallback.
		prevHolder, hadHolder := c.Get(fencing.ContextKey)
		c.Set(fencing.ContextKey, ctx)
		defer func() {
			// Runs when the handler returns and when it panics.
			if hadHolder {
				c.Set(fencing.ContextKey, prevHolder)
			} else {
				c.Delete(fencing.ContextKey)
			}
			c.Request = orig
			held := time.Since(heldAt)
			uerr := m.Unlock(ctx)
			g.metrics.hold.WithLabelValues(method, routeName).Observe(held.Seconds())
			switch {
			case Lost(ctx) || errors.Is(uerr, lock.ErrLost):
				g.metrics.lost.WithLabelValues(method, routeName).Inc()
				g.log.WarnContext(reqCtx, "guard: lock lost while the handler ran; its fenced writes were refused",
					"route", routeName, "key", key, "held", held, "cause", context.Cause(ctx))
			case uerr != nil:
				g.log.ErrorContext(reqCtx, "guard: unlock failed; it is retried in the background until the lock's lease ends", "route", routeName, "key", key, "err", uerr)
			}
			if held > r.longHold {
				g.log.WarnContext(reqCtx, "guard: lock held longer than the threshold; keep remote calls out of the critical section",
					"route", routeName, "key", key, "held", held, "threshold", r.longHold)
			}
		}()
		g.runHandler(c, next)
		g.afterHandler(c, ctx, method, routeName)
	}
}

// prepareLock does what comes before the lock: it decides whether the
// route is the template's, reads the body and resolves the key. ok is false
// when the request was answered (or passed through untouched).
func (g *Guard) prepareLock(c *gin.Context, fits *routeFits, tmpl *ginmw.Template, r route, next func()) (key string, ok bool) {
	switch fit, err := fits.of(c.Request.Context(), c.FullPath()); fit {
	case fitPass:
		next()
		return "", false
	case fitMismatch:
		_ = c.Error(err)
		ginmw.Abort(c, http.StatusInternalServerError, "lock_route_mismatch")
		return "", false
	}
	method, routeName := routeOf(c)
	// The whole body is read before the lock is taken: a client that
	// sends it slowly must not hold the lock while the handler waits.
	if err := readBody(c, r); err != nil {
		if errors.Is(err, ErrBodyTimeout) {
			g.metrics.rejected.WithLabelValues(method, routeName, "body_timeout").Inc()
			_ = c.Error(err)
			ginmw.Abort(c, http.StatusRequestTimeout, "body_timeout")
			return "", false
		}
		g.reject(c, method, routeName, err)
		return "", false
	}
	key, err := tmpl.Resolve(c, r.bodyLimit)
	if err != nil {
		g.reject(c, method, routeName, err)
		return "", false
	}
	return key, true
}

// ErrRouteMismatch is the error of a request on a route that a Lock's
// template cannot apply to: the template takes a <path:x> parameter the
// route does not have. Such a request is answered 500
// {"error":"lock_route_mismatch"}, and the first one on each route is logged
// as an error: it is a mistake in the code that registered the route.
var ErrRouteMismatch = errors.New("guard: lock template does not fit the route")

// ErrBodyTimeout is the error of a request whose body did not arrive within
// BodyTimeout; it is answered 408 {"error":"body_timeout"}.
var ErrBodyTimeout = errors.New("guard: request body not received in time")

// routeFit says what a Lock does on a route.
type routeFit uint8

const (
	fitApplies  routeFit = iota // the template takes its key from the route's requests
	fitPass                     // the route is not the template's: requests pass untouched
	fitMismatch                 // a <path:x> the route lacks: a mistake, answered 500
)

// fitOf decides what the Lock with template t does on route (c.FullPath()):
//   - an unknown route ("", a 404 or 405) passes untouched;
//   - a <path:x> field whose parameter the route lacks is a mismatch;
//   - a <x> field (no source) whose parameter the route lacks makes the
//     route pass untouched: that is how one router-level Lock guards the
//     routes that have :x and leaves /healthz alone;
//   - otherwise the lock applies.
func fitOf(t *ginmw.Template, route string) (routeFit, error) {
	if route == "" {
		return fitPass, nil
	}
	if err := t.CheckRoute(route); err != nil {
		return fitMismatch, fmt.Errorf("%w: %w", ErrRouteMismatch, err)
	}
	for _, f := range t.Fields() {
		if f.Source == ginmw.SourceAny && !ginmw.RouteHasParam(route, f.Name) {
			return fitPass, nil
		}
	}
	return fitApplies, nil
}

// routeFits remembers fitOf per route, and logs a route the first time it
// is seen not to fit.
type routeFits struct {
	tmpl *ginmw.Template
	log  *slog.Logger
	m    sync.Map // route → fitResult
}

type fitResult struct {
	fit routeFit
	err error
}

// of returns what the template does on route; the first request on each
// route, whose context is ctx, logs a route it does not lock.
func (f *routeFits) of(ctx context.Context, route string) (routeFit, error) {
	if v, ok := f.m.Load(route); ok {
		r := v.(fitResult)
		return r.fit, r.err
	}
	fit, err := fitOf(f.tmpl, route)
	if _, loaded := f.m.LoadOrStore(route, fitResult{fit, err}); !loaded && route != "" {
		switch fit {
		case fitMismatch:
			f.log.ErrorContext(ctx, "guard: lock template names a path parameter the route does not have; its requests are answered 500",
				"template", f.tmpl.String(), "route", route, "err", err)
		case fitPass:
			f.log.InfoContext(ctx, "guard: lock template does not apply to the route (it has no path parameter the template names); its requests pass unlocked",
				"template", f.tmpl.String(), "route", route)
		}
	}
	return fit, err
}

// readBody reads the request body whole, up to the route's BodyLimit and
// within its BodyTimeout (a read deadline on the connection, where the
// ResponseWriter offers one), so that the handler reads it from memory.
func readBody(c *gin.Context, r route) error {
	if body := c.Request.Body; body == nil || body == http.NoBody {
		return nil
	}
	rc := http.NewResponseController(c.Writer)
	bounded := rc.SetReadDeadline(time.Now().Add(r.bodyTimeout)) == nil
	_, err := ginmw.Body(c, r.bodyLimit)
	if err == nil && bounded {
		// The body is read to its end; the server sets its own deadlines
		// again for the connection's next request.
		_ = rc.SetReadDeadline(time.Time{})
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w within %v: %w", ErrBodyTimeout, r.bodyTimeout, err)
	}
	return err
}

// lockFailed answers a request whose lock was not acquired.
// endStep ends its StepLock, which took wait.
func (g *Guard) lockFailed(c *gin.Context, r route, method, routeName, key string, err error, wait time.Duration, endStep func(StepResult), next func()) {
	res := StepResult{Wait: wait, Err: err}
	switch {
	case c.Request.Context().Err() != nil:
		// The client gave up while waiting; nobody reads this answer.
		res.Outcome = OutcomeCancelled
		endStep(res)
		answeredByFramework(c)
		c.AbortWithStatus(StatusClientClosedRequest)
	case errors.Is(err, lock.ErrNotAcquired):
		res.Outcome = OutcomeBusy
		endStep(res)
		answeredByFramework(c)
		g.metrics.busy.WithLabelValues(method, routeName).Inc()
		ginmw.Abort(c, r.busyStatus, r.busyCode, ginmw.RetryAfter(r.retryAfter))
	case errors.Is(err, lock.ErrInvalid):
		res.Outcome = OutcomeInvalid
		endStep(res)
		answeredByFramework(c)
		g.log.ErrorContext(c.Request.Context(), "guard: the lock refused the request's key or the Guard's configuration", "route", routeName, "key", key, "err", err)
		ginmw.AbortError(c, err)
	case r.failOpen:
		res.Outcome = OutcomeFailOpen
		endStep(res)
		g.metrics.redisDown.WithLabelValues(method, routeName, "open").Inc()
		g.log.WarnContext(c.Request.Context(), "guard: lock unavailable; the route fails open and runs unprotected", "route", routeName, "key", key, "err", err)
		g.runHandler(c, next)
	default:
		res.Outcome = OutcomeUnavailable
		endStep(res)
		answeredByFramework(c)
		g.metrics.redisDown.WithLabelValues(method, routeName, "closed").Inc()
		g.log.ErrorContext(c.Request.Context(), "guard: lock unavailable", "route", routeName, "key", key, "err", err)
		_ = c.Error(err)
		ginmw.Abort(c, http.StatusServiceUnavailable, "lock_unavailable", ginmw.RetryAfter(r.retryAfter))
	}
}

// afterHandler answers 409 for a handler that hit a stale write or lost its
// lock and wrote nothing itself, and counts stale writes.
func (g *Guard) afterHandler(c *gin.Context, ctx context.Context, method, routeName string) {
	stale := staleError(c) != nil
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

// staleError returns the first error the handler reported with c.Error that
// matches fencing.ErrStale, or nil.
func staleError(c *gin.Context) error {
	for _, e := range c.Errors {
		if errors.Is(e.Err, fencing.ErrStale) {
			return e.Err
		}
	}
	return nil
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

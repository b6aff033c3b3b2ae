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
// Answers (all JSON {"error": ...}; the README's table lists every answer
// of the framework):
//
//	400 a key field is missing or unsafe       413 the body is over BodyLimit
//	408 the body did not arrive in BodyTimeout 500 the template does not fit the route
//	429 the key stayed locked for the wait     503 Redis is unreachable (unless FailOpen)
//	409 the handler's write was refused as stale ("stale_write") or the lock was
//	    lost while it ran ("lock_lost")
//
// The handler runs with the lock's context as its request context: pass
// it to the database, db.WithContext(c.Request.Context()), so writes carry
// the fencing token; it is cancelled with cause lock.ErrLost if the lock is
// lost, and the driver abandons a query then. The lock is released when the
// handler returns or panics.
//
// Not db.WithContext(c), the *gin.Context itself: it finds the token too
// (Lock publishes its context under fencing.ContextKey), but database/sql
// watches the context it is given from goroutines of its own (a result
// set's, inside a transaction and with ContextWithFallback outside one),
// which read it after the statement is done, and a *gin.Context is not a
// fixed context: its Done, Err and Value read c.Request, which the steps
// around the handler set back as they end (after the lock is lost, or the
// lock's own context ended, for the steps outside it) and which gin sets
// again when it reuses the Context for another request. The race detector
// reports it, with or without ContextWithFallback (and without the guard).
// Each guard step sets c.Request back before it ends the context it put
// there, which orders the write it makes, but neither the writes of the
// steps outside it nor gin's.
//
// A handler whose write was refused as stale, or that finds its lock lost,
// reports it with AbortStale(c, err): the answer is 409 "stale_write" (or
// "lock_lost") and it is never stored by Idempotent, so a retry runs. A
// handler that only records the error (c.Error(err), errors.Is(err,
// fencing.ErrStale)) and writes nothing is answered the same; one that
// writes an answer of its own instead (a 5xx, say) sends it as written,
// since answers are not held back to be rewritten, and that answer is not
// stored either.
//
// Lock composes with Idempotent and Combining in any order (router-level
// Use, per route, Policies): every order gives a request the same answer
// and stores the same record (see Idempotent).
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
		if !fits.applies(c, &r) {
			next()
			return
		}
		st := begin(c)
		g.lockRequest(c, st, tmpl, &r, lockOpts, next)
	}
}

// lockRequest is the lock step of a request on a route its template
// applies to: it reads the body, resolves the key, holds the lock around
// the rest of the chain and judges what the handler did under it. It ends
// the step (st.end) before it lets the lock go, so that when it is the
// request's last step the idempotency record is settled while the lock is
// still held: a duplicate that waits for the lock then finds it stored.
func (g *Guard) lockRequest(c *gin.Context, st *request, tmpl *ginmw.Template, r *route, lockOpts []lock.LockOption, next func()) {
	returned := false
	var h hold
	held := false
	defer func() {
		// Runs when the handler returns and when it panics.
		st.end(c, returned)
		if held {
			h.release()
		}
	}()
	key, ok := g.prepareLock(c, tmpl, r)
	if !ok {
		returned = true
		return
	}
	reqCtx := c.Request.Context()
	h, held = g.takeLock(c, r, key, false, func(mu *lock.Mutex) (context.Context, error) {
		return mu.TryLock(reqCtx, r.wait, lockOpts...)
	}, func() { g.runHandler(c, next) })
	if !held {
		returned = true
		return
	}
	orig := c.Request
	c.Request = orig.WithContext(h.ctx)
	st.lockKey, st.locks = key, g.locks
	// db.WithContext(c) with the *gin.Context itself finds the token
	// there, whatever the engine's ContextWithFallback.
	prevHolder, hadHolder := c.Get(fencing.ContextKey)
	c.Set(fencing.ContextKey, h.ctx)
	defer func() {
		if hadHolder {
			c.Set(fencing.ContextKey, prevHolder)
		} else {
			c.Delete(fencing.ContextKey)
		}
		c.Request = orig
	}()
	g.runHandler(c, next)
	g.judge(c, st, h.ctx)
	returned = true
}

// applies decides whether the route of c is the template's: a route it
// passes untouched returns false; a route it does not fit is answered 500
// lock_route_mismatch (a mistake in the code that registered it) and
// returns false too.
func (f *routeFits) applies(c *gin.Context, r *route) bool {
	switch fit, err := f.of(c.Request.Context(), c.FullPath()); fit {
	case fitPass:
		return false
	case fitMismatch:
		_ = c.Error(err)
		abort(c, answerRouteMismatch, r.retryAfter)
		return false
	}
	return true
}

// prepareLock does what comes before the lock: it reads the body and
// resolves the key. ok is false when the request was answered.
func (g *Guard) prepareLock(c *gin.Context, tmpl *ginmw.Template, r *route) (key string, ok bool) {
	method, routeName := routeOf(c)
	// The whole body is read before the lock is taken: a client that
	// sends it slowly must not hold the lock while the handler waits.
	if err := readBody(c, r); err != nil {
		if errors.Is(err, ErrBodyTimeout) {
			g.metrics.rejected.WithLabelValues(method, routeName, answerBodyTimeout.code).Inc()
			_ = c.Error(err)
			abort(c, answerBodyTimeout, r.retryAfter)
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
func readBody(c *gin.Context, r *route) error {
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

// judge decides, once the handler returned, what the request's answer
// means: a handler that hit a stale write or lost its lock did not do its
// work as the client asked, so its answer is never stored; one that wrote
// nothing itself is answered 409. It counts stale writes.
func (g *Guard) judge(c *gin.Context, st *request, ctx context.Context) {
	stale := staleError(c) != nil
	if stale {
		method, routeName := routeOf(c)
		g.metrics.stale.WithLabelValues(method, routeName).Inc()
	}
	lost := Lost(ctx)
	if stale || lost {
		st.unrepeatable = true
	}
	if c.Writer.Written() {
		return
	}
	switch {
	case stale:
		abort(c, answerStaleWrite, 0)
	case lost:
		abort(c, answerLockLost, 0)
	}
}

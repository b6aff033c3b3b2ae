package guard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/ginmw"
)

// idemConfig is the idempotency part of a route's configuration.
type idemConfig struct {
	header            string
	keyTmpl           *ginmw.Template
	required          bool
	scope             *ginmw.Template
	unscoped          bool
	fingerprint       Fingerprint
	ttl               time.Duration
	lease             time.Duration
	waitForFirst      time.Duration
	storeServerErrors bool
	storeClientErrors bool
	maxResponse       int
	replayHeaders     []string
}

// IdempotencyHeader sets the request header that carries the key. Default
// "Idempotency-Key" (draft-ietf-httpapi-idempotency-key-header).
func IdempotencyHeader(name string) RouteOption {
	if !validHeaderName(name) {
		return invalid("IdempotencyHeader(%q): not a header name a request can carry (want letters, digits and !#$%%&'*+-.^_`|~)", name)
	}
	return option(useIdem, "IdempotencyHeader", func(r *route) { r.idem.header, r.idem.keyTmpl = name, nil })
}

// IdempotencyKey takes the key from the request with a template instead of a
// header (default: the IdempotencyHeader), for clients that send none: "order:<ctx:user_id>:<body:order_no>"
// makes a repeated submission of one order a replay. It panics on a
// malformed template.
func IdempotencyKey(template string) RouteOption {
	t, err := ginmw.ParseTemplate(template)
	if err != nil {
		return invalid("IdempotencyKey: %w", err)
	}
	return option(useIdem, "IdempotencyKey", func(r *route) { r.idem.keyTmpl = t })
}

// OptionalKey lets requests without a key through, unguarded. Default: the
// key is required and a request without one is answered 400.
func OptionalKey() RouteOption {
	return option(useIdem, "OptionalKey", func(r *route) { r.idem.required = false })
}

// Scope names the caller whose keys these are, with a template such as
// "<ctx:user_id>" or "<header:X-Tenant>": records are kept per scope, so one
// caller can never be served another's stored response, even with the same
// key. Every Idempotent route needs a Scope, or Unscoped.
func Scope(template string) RouteOption {
	t, err := ginmw.ParseTemplate(template)
	if err != nil {
		return invalid("Scope: %w", err)
	}
	return option(useIdem, "Scope", func(r *route) { r.idem.scope, r.idem.unscoped = t, false })
}

// Unscoped shares one key space among all callers of the route. Only for
// keys a client cannot guess or choose for another client.
func Unscoped() RouteOption {
	return option(useIdem, "Unscoped", func(r *route) { r.idem.scope, r.idem.unscoped = nil, true })
}

// UseFingerprint sets what makes two requests with one key the same
// request. Default FingerprintAuto.
func UseFingerprint(f Fingerprint) RouteOption {
	return option(useIdem, "UseFingerprint", func(r *route) { r.idem.fingerprint = f })
}

// RecordTTL sets how long a completed response is replayed. Default
// DefaultRecordTTL (24h).
func RecordTTL(d time.Duration) RouteOption {
	if d < time.Millisecond {
		return invalid("RecordTTL(%v): must be at least 1ms", d)
	}
	return option(useIdem, "RecordTTL", func(r *route) { r.idem.ttl = d })
}

// InProgressLease sets how long a key stays in progress unless the instance
// running its request renews it: the Guard renews it every d/3 while the
// handler runs, so a key of an instance that died is free again within d.
// A request whose key could not be renewed before its lease ended, or was
// found taken over, has its context cancelled with cause lock.ErrLost, and
// its answer is not stored. On a route that WaitForFirst, the key is held by
// a semaphore permit of the Guard's lock Client instead, renewed by its
// watchdog (lock.WithWatchdogTimeout), so that waiting requests are woken
// when it ends. Default: the watchdog timeout of the Guard's lock Client
// (lock.WithWatchdogTimeout in WithLockOptions; DefaultInProgressLease,
// 30s, without it), so a key frees itself when its instance dies as soon as
// that instance's locks do; at least 30ms.
func InProgressLease(d time.Duration) RouteOption {
	if d < 30*time.Millisecond {
		return invalid("InProgressLease(%v): must be at least 30ms", d)
	}
	return option(useIdem, "InProgressLease", func(r *route) { r.idem.lease = d })
}

// WaitForFirst makes a request whose key is in progress wait up to d for the
// first request and replay its answer, instead of being answered 409 at
// once. A request inside a combining batch's turn (Combining outside
// Idempotent) never waits: the batch would wait with it. Default 0: answer
// 409 with Retry-After.
func WaitForFirst(d time.Duration) RouteOption {
	if d < 0 {
		return invalid("WaitForFirst(%v): must not be negative", d)
	}
	return option(useIdem, "WaitForFirst", func(r *route) { r.idem.waitForFirst = d })
}

// StoreClientErrors keeps the handler's 4xx answers and replays them, as
// Stripe does: a retry is answered as the first request was, even if the
// state that made it fail changed (a restock after sold_out). 408, 425 and
// 429, which ask the client to try again, are never kept. Default: only
// 2xx and 3xx answers are stored; a 4xx says that nothing happened, so a
// retry runs again.
func StoreClientErrors() RouteOption {
	return option(useIdem, "StoreClientErrors", func(r *route) { r.idem.storeClientErrors = true })
}

// StoreServerErrors keeps 5xx answers and replays them, as Stripe does.
// Default: a 5xx (or a panic) drops the record so that a retry runs again.
func StoreServerErrors() RouteOption {
	return option(useIdem, "StoreServerErrors", func(r *route) { r.idem.storeServerErrors = true })
}

// MaxResponse sets the largest response body that is stored for replay; a
// larger one reaches the client but is not stored (a log line says so), and a
// retry runs again. Default ginmw.DefaultRecordLimit (64 KiB).
func MaxResponse(n int) RouteOption {
	if n <= 0 {
		return invalid("MaxResponse(%d): must be positive", n)
	}
	return option(useIdem, "MaxResponse", func(r *route) { r.idem.maxResponse = n })
}

// ReplayHeaders names response headers stored and replayed besides
// Content-Type, such as "Location". Default: none.
func ReplayHeaders(names ...string) RouteOption {
	for _, n := range names {
		if !validHeaderName(n) {
			return invalid("ReplayHeaders(%q): not a header name", n)
		}
	}
	return option(useIdem, "ReplayHeaders", func(r *route) { r.idem.replayHeaders = append(r.idem.replayHeaders, names...) })
}

// ReplayedHeader marks a replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// Idempotent returns middleware that gives the rest of the chain one effect
// per idempotency key and caller: the first request with a key runs the
// handler and its answer (status, Content-Type and ReplayHeaders, body) is
// stored; a later request with the key and the same identity (method, route
// template, path parameters, query, media type and body, see Fingerprint)
// gets that answer replayed, with the header Idempotent-Replayed: true, and
// the handler does not run.
//
// The key is required by default: a request without one is answered 400
// idempotency_key_missing (OptionalKey lets it through unguarded).
//
//	400 idempotency_key_missing   no key, and the key is required
//	400 idempotency_key_invalid   malformed, empty, non-ASCII or over 255 bytes
//	422 idempotency_key_reused    the key was used with a request of another identity
//	409 request_in_progress       the first request with the key still runs
//	503 idempotency_unavailable   Redis is unreachable (unless FailOpen)
//
// While the first request runs, its key is marked in progress in Redis,
// renewed while the handler works and expiring by itself if the instance
// dies (InProgressLease), so a key is never stuck "in progress". A request
// that runs its handler costs Redis two round trips: one before the handler
// (look the key up and mark it) and one after (store the answer, or drop the
// mark); a replay costs one.
//
// Only the handler's own answer is stored, and by default only a 2xx or 3xx
// one. What the framework answered itself (a Lock found the key busy or
// Redis down, refused a key field or the body, or the client went away while
// it waited) releases the key at once; so do a 4xx of the handler (it says
// nothing happened; StoreClientErrors keeps them), a 5xx (StoreServerErrors
// keeps them), a panic, a lost lock, a stale write and a combining batch
// that did not commit: the retry runs. Every Idempotent route needs Scope or
// Unscoped; Idempotent panics at registration otherwise.
//
// Order does not matter. Idempotent, Lock and Combining may be registered
// in any order (router-level Use, per route, Policies): the record is
// written once, by the guard step that finishes last, when the request's
// final answer is known (after the lock step judged a lost lock or a stale
// write, after a combining batch committed), so every order gives a request
// the same answer and stores the same record. What a concurrent duplicate of
// a running request gets meanwhile follows from which step it meets first:
//
//   - Idempotent outside the lock (Idempotent before Lock on the route, or
//     router-level, or Policies): 409 request_in_progress at once, or with
//     WaitForFirst a wait and the first answer replayed.
//   - Lock outside Idempotent: the duplicate waits for the lock (up to
//     Wait; 429 busy after it), and is then replayed the first answer, which
//     is stored before the lock is released; or runs, if that answer is not
//     stored.
//   - Combining outside Idempotent: the duplicate waits in the key's line
//     and, taken into the same batch, is answered 409 request_in_progress
//     (inside a batch nobody waits for the first, WaitForFirst or not); in a
//     later batch, the replay once the first batch's record is stored, or
//     409 until then.
//
// Either way the handler runs at most once, and only an answer whose work
// was done (its batch committed, its lock held to the end) is replayed.
func (g *Guard) Idempotent(opts ...RouteOption) gin.HandlerFunc {
	return g.handler(g.idempotentStep(g.mustRoute(opts, useIdem), false))
}

// idempotentStep returns the idempotency step of route r. inner says that
// the step's next is another step of the Guard's (Policies' lock), which
// reports StepHandler itself.
func (g *Guard) idempotentStep(r route, inner bool) step {
	mustf(r.idem.scope != nil || r.idem.unscoped,
		"Idempotent needs guard.Scope(\"<ctx:user_id>\") (whose keys these are) or guard.Unscoped()")
	return func(c *gin.Context, next func()) {
		st := begin(c)
		returned := false
		defer func() { st.end(c, returned) }()
		g.idempotentRequest(c, st, &r, inner, next)
		returned = true
	}
}

// idempotentRequest is the idempotency step of a request: it claims the
// request's key (or answers: a replay, 409, 422, 400, 503) and runs the rest
// of the chain holding it. The claim belongs to the request's state, and
// the request's last step settles it (request.end), once the final answer
// is known.
func (g *Guard) idempotentRequest(c *gin.Context, st *request, r *route, inner bool, next func()) {
	if st.claim != nil {
		next() // another idempotency step of the request holds its key
		return
	}
	ic := &r.idem
	method, routeName := routeOf(c)
	run := next // the rest of the chain, holding the key
	if !inner && g.hook != nil {
		run = func() { g.runHandler(c, next) }
	}
	key, ok, err := ic.key(c, r.bodyLimit)
	if err != nil {
		g.reject(c, method, routeName, err)
		return
	}
	if !ok {
		next() // no key, and none required
		return
	}
	scope := ""
	if ic.scope != nil {
		if scope, err = ic.scope.Resolve(c, r.bodyLimit); err != nil {
			g.reject(c, method, routeName, err)
			return
		}
	}
	body, err := ginmw.Body(c, r.bodyLimit)
	if err != nil {
		g.reject(c, method, routeName, err)
		return
	}
	fp, err := ic.fingerprint.sum(c, routeName, body)
	if err != nil {
		g.metrics.rejected.WithLabelValues(method, routeName, answerBadBody.code).Inc()
		abort(c, answerBadBody, r.retryAfter, ginmw.Extra("detail", err.Error()))
		return
	}
	id := recordID(method, routeName, scope, key)
	c.Set(idemKeyName, id)
	c.Set(idemFPName, fp)
	cl := &st.slot
	*cl = claim{g: g, ic: ic, id: id, recKey: g.recordPrefix + "{" + id + "}:r", fp: fp, method: method, route: routeName}

	// The key becomes the request's until its record is settled, or the
	// request is answered (a replay, 409, 422, 503) and ok is false.
	bg, endBegin := g.step(c.Request.Context(), c, StepIdempotencyBegin, "")
	var ctx context.Context
	if ic.waitForFirst > 0 {
		ctx, ok = g.claimWaiting(c, st, r, cl, bg, endBegin, run)
	} else {
		ctx, ok = g.claimKey(c, st, r, cl, bg, endBegin, run)
	}
	if !ok {
		return
	}
	cl.rcd = ginmw.Record(c, ic.maxResponse)
	st.claim = cl
	g.metrics.idem.WithLabelValues(method, routeName, "executed").Inc()
	orig := c.Request
	c.Request = orig.WithContext(ctx)
	defer func() { c.Request = orig }()
	run()
}

// key returns the request's idempotency key; ok is false when there is none
// and none is required.
func (ic *idemConfig) key(c *gin.Context, bodyLimit int64) (key string, ok bool, err error) {
	if ic.keyTmpl != nil {
		key, err = ic.keyTmpl.Resolve(c, bodyLimit)
		if errors.Is(err, ginmw.ErrMissingField) && !ic.required {
			return "", false, nil
		}
		return key, err == nil, err
	}
	lines := c.Request.Header.Values(ic.header)
	if len(lines) == 0 {
		if ic.required {
			return "", false, errMissingKey
		}
		return "", false, nil
	}
	key, err = parseIdempotencyKey(lines)
	return key, err == nil, err
}

var errMissingKey = fmt.Errorf("%w: missing", errIdemKey)

// IdempotencyRecord returns the id of the request's idempotency record: a
// short hash of method, route, caller and key, but not of the rest of the
// request's identity. Store it in a unique-indexed column of the row the
// request creates, and IdempotencyFingerprint beside it:
// gormplugin.ErrDuplicate then tells a repeat that slipped past a lost
// record (same fingerprint: answer with the row) from the key reused for
// another request (another fingerprint: AbortKeyReused).
func IdempotencyRecord(c *gin.Context) (string, bool) {
	v, ok := c.Get(idemKeyName)
	s, _ := v.(string)
	return s, ok && s != ""
}

// IdempotencyFingerprint returns the fingerprint of the request's identity
// (method, route template, path parameters, query, media type and body, as
// the route's Fingerprint reads them) that its idempotency record is
// compared with: 64 hexadecimal characters. Store it beside
// IdempotencyRecord: a row found by the record id whose fingerprint differs
// was created by another request with the same key, and must be answered
// with AbortKeyReused, not replayed.
func IdempotencyFingerprint(c *gin.Context) (string, bool) {
	v, ok := c.Get(idemFPName)
	s, _ := v.(string)
	return s, ok && s != ""
}

// AbortKeyReused answers 422 idempotency_key_reused, as the Idempotent
// middleware does, for a handler whose database backstop found the key used
// by a request of another identity (see IdempotencyFingerprint). The answer
// is not stored: the key's record stays free for the request it belongs to.
func AbortKeyReused(c *gin.Context) {
	abort(c, answerKeyReused, 0)
}

package guard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/lock"
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
// once. Default 0: answer 409 with Retry-After.
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

// recordPrefix starts the Redis keys of idempotency records and their
// in-progress locks; the braces keep both in one Cluster slot.
const recordPrefix = "seckillguard:idem:"

var (
	//go:embed scripts/idem_begin.lua
	beginSource string
	//go:embed scripts/idem_take.lua
	takeSource string
	//go:embed scripts/idem_finish.lua
	finishSource string

	beginScript  = redis.NewScript(beginSource)
	takeScript   = redis.NewScript(takeSource)
	finishScript = redis.NewScript(finishSource)
)

// Idempotent returns middleware that gives the rest of the chain one effect
// per idempotency key and caller: the first request with a key runs the
// handler and its answer (status, Content-Type and ReplayHeaders, body) is
// stored; a later request with the key and the same identity (method, route
// template, path parameters, query, media type and body, see Fingerprint)
// gets that answer replayed, with the header Idempotent-Replayed: true, and
// the handler does not run.
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
// one. What the framework answered itself (a later Lock found the key busy
// or Redis down, refused a key field or the body, or the client went away
// while it waited) releases the key at once; so do a 4xx of the handler
// (it says nothing happened; StoreClientErrors keeps them), a 5xx
// (StoreServerErrors keeps them), a panic and a lost lock: the retry runs.
// Every Idempotent route needs Scope or Unscoped; Idempotent panics at
// registration otherwise.
func (g *Guard) Idempotent(opts ...RouteOption) gin.HandlerFunc {
	return g.handler(g.idempotentStep(g.mustRoute(opts, useIdem), false))
}

// idempotentStep returns the idempotency step of route r. inner says that
// the step's next is another step of the Guard's (Policies' lock), which
// reports StepHandler itself.
func (g *Guard) idempotentStep(r route, inner bool) step {
	ic := r.idem
	mustf(ic.scope != nil || ic.unscoped,
		"Idempotent needs guard.Scope(\"<ctx:user_id>\") (whose keys these are) or guard.Unscoped()")
	return func(c *gin.Context, next func()) {
		method, routeName := routeOf(c)
		idem := g.metrics.idem
		run := next // the rest of the chain, holding the key
		if !inner && g.hook != nil {
			run = func() { g.runHandler(c, next) }
		}
		key, ok, err := ic.key(c, r.bodyLimit)
		if err != nil {
			g.rejectIdem(c, method, routeName, err)
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
			g.metrics.rejected.WithLabelValues(method, routeName, "bad_body").Inc()
			ginmw.Abort(c, http.StatusBadRequest, "bad_body", ginmw.Extra("detail", err.Error()))
			return
		}
		id := recordID(method, routeName, scope, key)
		recKey := recordPrefix + "{" + id + "}:r"
		c.Set(idemKeyName, id)
		c.Set(idemFPName, fp)

		// The key becomes this execution's for as long as ctx lasts, or
		// the request is answered (a replay, 409, 422, 503) and ok is false.
		bg, endBegin := g.step(c.Request.Context(), c, StepIdempotencyBegin, "")
		take := g.beginIdem
		if ic.waitForFirst > 0 {
			take = g.beginIdemWaiting
		}
		ctx, marker, release, ok := take(c, r, bg, endBegin, recKey, fp, method, routeName, run)
		if !ok {
			return
		}
		defer release()
		bctx := context.WithoutCancel(ctx)

		idem.WithLabelValues(method, routeName, "executed").Inc()
		rcd := ginmw.Record(c, ic.maxResponse)
		orig := c.Request
		c.Request = orig.WithContext(ctx)
		done := false
		defer func() {
			c.Request = orig
			if !done { // the handler panicked: a retry must run again
				fctx, endFinish := g.step(bctx, c, StepIdempotencyFinish, "")
				g.dropRecord(fctx, recKey, marker, routeName)
				g.metrics.records.WithLabelValues(method, routeName, "dropped").Inc()
				endFinish(StepResult{Outcome: OutcomeDropped})
			}
		}()
		run()
		done = true
		g.finish(bctx, c, ctx, ic, rcd, recKey, marker, fp, method, routeName)
	}
}

// beginIdem makes the key this execution's in one round trip (idem_begin.lua):
// the marker it sets lasts for the route's InProgressLease, renewed by the
// Guard's keeper while the handler runs, so that a dead instance frees the
// key by itself. A key already completed is replayed, one in progress is
// answered 409 (422 for another fingerprint), and ok is false. It ends the
// request's StepIdempotencyBegin (endBegin); bg is that step's context.
// release ends the renewal and the returned context.
func (g *Guard) beginIdem(c *gin.Context, r route, bg context.Context, endBegin func(StepResult), recKey, fp, method, routeName string, run func()) (_ context.Context, marker string, release func(), ok bool) {
	ic := r.idem
	reqCtx := c.Request.Context()
	marker = "p" + fp + ":" + nonce()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		raw, err := beginScript.Run(bg, g.rdb, []string{recKey}, marker, ic.lease.Milliseconds()).Text()
		if err != nil && !errors.Is(err, redis.Nil) {
			g.idemUnavailable(c, r, method, routeName, err, endBegin, 0, run)
			return nil, "", nil, false
		}
		if raw == "" {
			ctx, cancel := context.WithCancelCause(reqCtx)
			f := g.keeper.keep(reqCtx, recKey, marker, ic.lease, sent, cancel)
			endBegin(StepResult{Outcome: OutcomeExecute})
			return ctx, marker, func() { g.keeper.drop(f); cancel(nil) }, true
		}
		rec, markerFP, err := decodeRecord(raw)
		switch {
		case rec != nil:
			endBegin(StepResult{Outcome: OutcomeReplay})
			g.replay(c, rec, fp, method, routeName)
			return nil, "", nil, false
		case markerFP != "" && markerFP != fp:
			endBegin(StepResult{Outcome: OutcomeMismatch})
			g.metrics.idem.WithLabelValues(method, routeName, "mismatch").Inc()
			ginmw.Abort(c, http.StatusUnprocessableEntity, "idempotency_key_reused")
			return nil, "", nil, false
		case markerFP != "":
			endBegin(StepResult{Outcome: OutcomeInProgress})
			g.metrics.idem.WithLabelValues(method, routeName, "in_progress").Inc()
			ginmw.Abort(c, http.StatusConflict, "request_in_progress", ginmw.RetryAfter(r.retryAfter))
			return nil, "", nil, false
		case attempt > 0:
			g.idemUnavailable(c, r, method, routeName, err, endBegin, 0, run)
			return nil, "", nil, false
		}
		// Unreadable: drop it (if it is still there) and take the key.
		g.log.ErrorContext(reqCtx, "guard: unreadable idempotency record; running the request again", "route", routeName, "err", err)
		g.dropRecord(context.WithoutCancel(bg), recKey, raw, routeName)
	}
}

// beginIdemWaiting is beginIdem for a route that WaitForFirst: the key is
// held by a semaphore permit of the Guard's lock Client, renewed by its
// watchdog, and a request that finds it in progress waits for the permit
// (woken when it is released) and then replays the answer stored
// meanwhile. The context is the permit's; release frees the permit.
func (g *Guard) beginIdemWaiting(c *gin.Context, r route, bg context.Context, endBegin func(StepResult), recKey, fp, method, routeName string, run func()) (_ context.Context, marker string, release func(), ok bool) {
	ic := r.idem
	idem := g.metrics.idem
	// One round trip for a replay.
	raw, err := g.rdb.Get(bg, recKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		g.idemUnavailable(c, r, method, routeName, err, endBegin, 0, run)
		return nil, "", nil, false
	}
	rec, markerFP, err := decodeRecord(raw)
	if err != nil {
		g.log.ErrorContext(c.Request.Context(), "guard: unreadable idempotency record; running the request again", "route", routeName, "err", err)
	}
	if rec != nil {
		endBegin(StepResult{Outcome: OutcomeReplay})
		g.replay(c, rec, fp, method, routeName)
		return nil, "", nil, false
	}

	wait := ic.waitForFirst
	if markerFP != "" && markerFP != fp {
		wait = 0 // a different request: no point waiting for it
	}
	// A permit, not a Mutex: it issues no fencing token (the handler's
	// writes keep the token of the lock that protects them, if any) and
	// leaves no token counter behind.
	sem := g.locks.Semaphore(strings.TrimSuffix(recKey, ":r"), 1)
	claimed := time.Now()
	ctx, err := sem.TryAcquire(c.Request.Context(), wait)
	waited := time.Since(claimed)
	switch {
	case err != nil && c.Request.Context().Err() != nil:
		endBegin(StepResult{Outcome: OutcomeCancelled, Wait: waited, Err: err})
		c.AbortWithStatus(StatusClientClosedRequest)
		return nil, "", nil, false
	case errors.Is(err, lock.ErrNotAcquired):
		if markerFP != "" && markerFP != fp {
			endBegin(StepResult{Outcome: OutcomeMismatch, Wait: waited, Err: err})
			idem.WithLabelValues(method, routeName, "mismatch").Inc()
			ginmw.Abort(c, http.StatusUnprocessableEntity, "idempotency_key_reused")
			return nil, "", nil, false
		}
		endBegin(StepResult{Outcome: OutcomeInProgress, Wait: waited, Err: err})
		idem.WithLabelValues(method, routeName, "in_progress").Inc()
		ginmw.Abort(c, http.StatusConflict, "request_in_progress", ginmw.RetryAfter(r.retryAfter))
		return nil, "", nil, false
	case err != nil:
		g.idemUnavailable(c, r, method, routeName, err, endBegin, waited, run)
		return nil, "", nil, false
	}
	release = func() {
		if uerr := sem.Release(ctx); uerr != nil && !errors.Is(uerr, lock.ErrLost) {
			g.log.ErrorContext(c.Request.Context(), "guard: releasing an idempotency key failed; it frees itself with its lease", "route", routeName, "err", uerr)
		}
	}

	marker = "p" + fp + ":" + nonce()
	res, err := takeScript.Run(context.WithoutCancel(bg), g.rdb, []string{recKey}, marker, ic.ttl.Milliseconds()).Text()
	if err != nil && !errors.Is(err, redis.Nil) {
		release()
		g.idemUnavailable(c, r, method, routeName, err, endBegin, waited, run)
		return nil, "", nil, false
	}
	if res != "" {
		// Completed while this request waited for the key.
		if rec, _, err := decodeRecord(res); err == nil && rec != nil {
			release()
			endBegin(StepResult{Outcome: OutcomeReplay, Wait: waited})
			g.replay(c, rec, fp, method, routeName)
			return nil, "", nil, false
		}
	}
	endBegin(StepResult{Outcome: OutcomeExecute, Wait: waited})
	return ctx, marker, release, true
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

// rejectIdem answers a request whose idempotency key is missing or bad.
func (g *Guard) rejectIdem(c *gin.Context, method, routeName string, err error) {
	if !errors.Is(err, errIdemKey) {
		g.reject(c, method, routeName, err)
		return
	}
	g.metrics.rejected.WithLabelValues(method, routeName, "idempotency_key").Inc()
	if errors.Is(err, errMissingKey) {
		ginmw.Abort(c, http.StatusBadRequest, "idempotency_key_missing")
		return
	}
	ginmw.Abort(c, http.StatusBadRequest, "idempotency_key_invalid", ginmw.Extra("detail", err.Error()))
}

// idemUnavailable answers a request whose record or key Redis did not
// give; endBegin ends its StepIdempotencyBegin, which waited wait for the key.
func (g *Guard) idemUnavailable(c *gin.Context, r route, method, routeName string, err error, endBegin func(StepResult), wait time.Duration, next func()) {
	res := StepResult{Wait: wait, Err: err}
	if c.Request.Context().Err() != nil {
		// The client went away during the call: Redis is not to blame.
		res.Outcome = OutcomeCancelled
		endBegin(res)
		c.AbortWithStatus(StatusClientClosedRequest)
		return
	}
	if r.failOpen {
		res.Outcome = OutcomeFailOpen
		endBegin(res)
		g.metrics.redisDown.WithLabelValues(method, routeName, "open").Inc()
		g.log.WarnContext(c.Request.Context(), "guard: idempotency unavailable; the route fails open and runs unguarded", "route", routeName, "err", err)
		next()
		return
	}
	res.Outcome = OutcomeUnavailable
	endBegin(res)
	g.metrics.redisDown.WithLabelValues(method, routeName, "closed").Inc()
	g.log.ErrorContext(c.Request.Context(), "guard: idempotency unavailable", "route", routeName, "err", err)
	_ = c.Error(err)
	ginmw.Abort(c, http.StatusServiceUnavailable, "idempotency_unavailable", ginmw.RetryAfter(r.retryAfter))
}

// replay answers with a stored response, or 422 when it was stored for a
// different request.
func (g *Guard) replay(c *gin.Context, rec *record, fp, method, routeName string) {
	_, end := g.step(c.Request.Context(), c, StepIdempotencyReplay, "")
	if rec.Fingerprint != fp {
		g.metrics.idem.WithLabelValues(method, routeName, "mismatch").Inc()
		ginmw.Abort(c, http.StatusUnprocessableEntity, "idempotency_key_reused")
		end(StepResult{Outcome: OutcomeMismatch, Status: http.StatusUnprocessableEntity})
		return
	}
	defer func() { end(StepResult{Outcome: OutcomeReplayed, Status: c.Writer.Status()}) }()
	g.metrics.idem.WithLabelValues(method, routeName, "replayed").Inc()
	resp := rec.response()
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	resp.Header.Set(ReplayedHeader, "true")
	ginmw.Replay(c, resp)
}

// finish stores the handler's answer, or drops the in-progress marker when
// the answer must not be replayed: one the framework gave itself (a later
// step refused the request, found the lock busy or Redis down, or the
// client went away while it waited), a transient status, or a request whose
// lock was lost, whose write was refused as stale, or whose own permit for
// the key ran out (a newer execution may have the key by now). Either is
// done only while the marker is still this execution's.
func (g *Guard) finish(ctx context.Context, c *gin.Context, held context.Context, ic idemConfig, rcd *ginmw.Recorder, recKey, marker, fp, method, routeName string) {
	ctx, endStep := g.step(ctx, c, StepIdempotencyFinish, "")
	res := StepResult{Outcome: OutcomeStored}
	defer func() { endStep(res) }()
	idem := g.metrics.records
	resp, err := rcd.Response(ic.replayHeaders...)
	if err != nil {
		res = StepResult{Outcome: OutcomeNotStored, Err: err}
		g.log.WarnContext(ctx, "guard: response not stored for idempotent replay; a retry runs the request again",
			"route", routeName, "reason", err)
		g.dropRecord(ctx, recKey, marker, routeName)
		idem.WithLabelValues(method, routeName, "not_stored").Inc()
		return
	}
	if c.GetBool(frameworkName) || !storable(resp.Status, ic) || c.GetBool(unrepeatableName) || Lost(held) {
		res.Outcome = OutcomeDropped
		g.dropRecord(ctx, recKey, marker, routeName)
		idem.WithLabelValues(method, routeName, "dropped").Inc()
		return
	}
	data, err := encodeRecord(fp, resp)
	var stored int64
	if err == nil {
		stored, err = finishScript.Run(ctx, g.rdb, []string{recKey}, marker, data, ic.ttl.Milliseconds()).Int64()
	}
	switch {
	case err != nil:
		res = StepResult{Outcome: OutcomeNotStored, Err: err}
		g.log.ErrorContext(ctx, "guard: storing an idempotent response failed; a retry runs the request again", "route", routeName, "err", err)
		g.dropRecord(ctx, recKey, marker, routeName)
		idem.WithLabelValues(method, routeName, "not_stored").Inc()
	case stored == 0:
		res.Outcome = OutcomeNotStored
		g.log.WarnContext(ctx, "guard: response not stored: a newer execution took the idempotency key", "route", routeName)
		idem.WithLabelValues(method, routeName, "not_stored").Inc()
	default:
		idem.WithLabelValues(method, routeName, "stored").Inc()
	}
}

// storable reports whether the handler's answer with status is replayed to
// retries: a 2xx or 3xx always; a 4xx only where the route keeps them (it
// says nothing happened, and a retry may succeed), never one that asks the
// client to try again; a 5xx only where the route keeps them.
func storable(status int, ic idemConfig) bool {
	switch {
	case status == 0:
		return true
	case status >= 500:
		return ic.storeServerErrors
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests,
		status == StatusClientClosedRequest:
		return false
	case status >= 400:
		return ic.storeClientErrors
	}
	return status >= 200
}

// dropRecord removes this execution's in-progress marker, so that a retry
// runs the request again.
func (g *Guard) dropRecord(ctx context.Context, recKey, marker, routeName string) {
	if err := finishScript.Run(ctx, g.rdb, []string{recKey}, marker, "", 0).Err(); err != nil {
		g.log.WarnContext(ctx, "guard: dropping an in-progress idempotency marker failed; it expires with the record TTL",
			"route", routeName, "err", err)
	}
}

// nonce returns a random string that tells one execution's in-progress
// marker from another's.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// recordID names the record of a key: a hash of the method, the route, the
// caller's scope and the key, so that keys of any content give short, safe
// Redis keys and one caller's key can never address another's record.
func recordID(method, routeName, scope, key string) string {
	h := sha256.New()
	for _, s := range []string{method, routeName, scope, key} {
		io.WriteString(h, strconv.Itoa(len(s)))
		h.Write([]byte{':'})
		io.WriteString(h, s)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

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
	answeredByFramework(c)
	ginmw.Abort(c, http.StatusUnprocessableEntity, "idempotency_key_reused")
}

// record is a completed idempotent response as stored in Redis.
type record struct {
	Fingerprint string      `json:"fp"`
	Status      int         `json:"status"`
	Header      http.Header `json:"header,omitempty"`
	Body        []byte      `json:"body,omitempty"`
}

func (r *record) response() ginmw.Response {
	return ginmw.Response{Status: r.Status, Header: r.Header.Clone(), Body: r.Body}
}

func encodeRecord(fp string, resp ginmw.Response) (string, error) {
	data, err := json.Marshal(record{Fingerprint: fp, Status: resp.Status, Header: resp.Header, Body: resp.Body})
	if err != nil {
		return "", err
	}
	return "c" + string(data), nil
}

// decodeRecord reads a stored value: a completed record, or the fingerprint
// of an in-progress marker.
func decodeRecord(raw string) (rec *record, markerFP string, err error) {
	switch {
	case raw == "":
		return nil, "", nil
	case raw[0] == 'p':
		fp, _, _ := strings.Cut(raw[1:], ":") // "p" fingerprint ":" nonce
		return nil, fp, nil
	case raw[0] == 'c':
		rec = new(record)
		if err := json.Unmarshal([]byte(raw[1:]), rec); err != nil {
			return nil, "", fmt.Errorf("guard: idempotency record: %w", err)
		}
		return rec, "", nil
	}
	return nil, "", fmt.Errorf("guard: idempotency record of unknown kind %q", raw[:1])
}

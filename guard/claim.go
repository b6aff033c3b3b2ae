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

// recordPrefix starts the name of every idempotency record; the record's
// Redis key is the name with the Guard's namespace in front (the lock
// Client's Key, the one place the namespace is applied) and ":r" after it.
// The braces around the record's id keep the record and the WaitForFirst
// semaphore of the same name in one Cluster slot.
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

// A claim is a request's hold on its idempotency key, from the moment the
// key is marked in progress until the request's record is settled: the
// answer stored, or the marker dropped. The request's state owns it, and
// its last step settles it (request.end).
type claim struct {
	g             *Guard
	ic            *idemConfig
	id            string // the record's id (recordID)
	recKey        string // the record's Redis key
	marker        string // this execution's in-progress marker
	fp            string // the request's fingerprint
	method, route string
	// ctx lasts as long as the claim holds the key: it is cancelled with
	// cause lock.ErrLost when the key is found lost (its marker gone or
	// another execution's, its permit's lease ended).
	ctx     context.Context
	release func()          // ends the claim: its renewal, its permit
	rcd     *ginmw.Recorder // the answer as it is sent
}

// claimKey makes the key the request's in one round trip (idem_begin.lua):
// the marker it sets lasts for the route's InProgressLease, renewed by the
// Guard's keeper until the claim is released, so that a dead instance frees
// the key by itself. A key already completed is replayed, one in progress is
// answered 409 (422 for another fingerprint), and ok is false. It ends the
// request's StepIdempotencyBegin (endBegin); bg is that step's context. The
// returned context is the rest of the chain's: the request's, cancelled
// with cause lock.ErrLost when the key is lost.
func (g *Guard) claimKey(c *gin.Context, st *request, r *route, cl *claim, bg context.Context, endBegin func(StepResult), run func()) (_ context.Context, ok bool) {
	ic := cl.ic
	cur := c.Request.Context()
	cl.marker = "p" + cl.fp + ":" + nonce()
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		raw, err := beginScript.Run(bg, g.rdb, []string{cl.recKey}, cl.marker, ic.lease.Milliseconds()).Text()
		if err != nil && !errors.Is(err, redis.Nil) {
			g.idemUnavailable(c, r, cl, err, endBegin, 0, run)
			return nil, false
		}
		if raw == "" {
			ctx, cancel := context.WithCancelCause(cur)
			f := g.keeper.keep(st.base, cl.recKey, cl.marker, ic.lease, sent, cancel)
			cl.ctx = ctx
			cl.release = func() { g.keeper.drop(f); cancel(nil) }
			endBegin(StepResult{Outcome: OutcomeExecute})
			return ctx, true
		}
		rec, markerFP, err := decodeRecord(raw)
		switch {
		case rec != nil:
			endBegin(StepResult{Outcome: OutcomeReplay})
			g.replay(c, rec, cl)
			return nil, false
		case markerFP != "" && markerFP != cl.fp:
			endBegin(StepResult{Outcome: OutcomeMismatch})
			g.metrics.idem.WithLabelValues(cl.method, cl.route, "mismatch").Inc()
			abort(c, answerKeyReused, r.retryAfter)
			return nil, false
		case markerFP != "":
			endBegin(StepResult{Outcome: OutcomeInProgress})
			g.metrics.idem.WithLabelValues(cl.method, cl.route, "in_progress").Inc()
			abort(c, answerKeyInProgress, r.retryAfter)
			return nil, false
		case attempt > 0:
			g.idemUnavailable(c, r, cl, err, endBegin, 0, run)
			return nil, false
		}
		// Unreadable: drop it (if it is still there) and take the key.
		g.log.ErrorContext(cur, "guard: unreadable idempotency record; running the request again", "route", cl.route, "key", cl.recKey, "err", err)
		g.dropRecord(context.WithoutCancel(bg), cl.recKey, raw, cl.route)
	}
}

// claimWaiting is claimKey for a route that WaitForFirst: the key is held
// by a semaphore permit of the Guard's lock Client, renewed by its
// watchdog, and a request that finds it in progress waits for the permit
// (woken when it is released) and then replays the answer stored
// meanwhile. The permit lasts until the record is settled, whatever the
// steps inside do to the request's context (a batch's turn ends before its
// batch commits) and also when the client goes away (permitFor); inside a
// combining batch's turn nobody waits (the batch would wait with it): a
// request that finds the key in progress there is answered 409 at once.
func (g *Guard) claimWaiting(c *gin.Context, st *request, r *route, cl *claim, bg context.Context, endBegin func(StepResult), run func()) (_ context.Context, ok bool) {
	ic := cl.ic
	cur := c.Request.Context()
	idem := g.metrics.idem
	// One round trip for a replay.
	raw, err := g.rdb.Get(bg, cl.recKey).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		g.idemUnavailable(c, r, cl, err, endBegin, 0, run)
		return nil, false
	}
	rec, markerFP, err := decodeRecord(raw)
	if err != nil {
		g.log.ErrorContext(cur, "guard: unreadable idempotency record; running the request again", "route", cl.route, "key", cl.recKey, "err", err)
	}
	if rec != nil {
		endBegin(StepResult{Outcome: OutcomeReplay})
		g.replay(c, rec, cl)
		return nil, false
	}

	wait := ic.waitForFirst
	if markerFP != "" && markerFP != cl.fp || st.batched {
		wait = 0 // a different request: no point waiting for it; or a batch's turn, which must not wait
	}
	// A permit, not a Mutex: it issues no fencing token (the handler's
	// writes keep the token of the lock that protects them, if any) and
	// leaves no token counter behind; its count of free permits expires one
	// lease after the permit. Its name is the record's without the
	// namespace: the lock Client applies it.
	sem := g.locks.Semaphore(recordPrefix+"{"+cl.id+"}", 1)
	claimed := time.Now()
	permit, err := permitFor(sem, st.base, wait)
	waited := time.Since(claimed)
	switch {
	case err != nil && (cur.Err() != nil || st.base.Err() != nil):
		endBegin(StepResult{Outcome: OutcomeCancelled, Wait: waited, Err: err})
		abort(c, answerClientGone, r.retryAfter)
		return nil, false
	case errors.Is(err, lock.ErrNotAcquired):
		if markerFP != "" && markerFP != cl.fp {
			endBegin(StepResult{Outcome: OutcomeMismatch, Wait: waited, Err: err})
			idem.WithLabelValues(cl.method, cl.route, "mismatch").Inc()
			abort(c, answerKeyReused, r.retryAfter)
			return nil, false
		}
		endBegin(StepResult{Outcome: OutcomeInProgress, Wait: waited, Err: err})
		idem.WithLabelValues(cl.method, cl.route, "in_progress").Inc()
		abort(c, answerKeyInProgress, r.retryAfter)
		return nil, false
	case errors.Is(err, lock.ErrUnavailable):
		g.idemUnavailable(c, r, cl, err, endBegin, waited, run)
		return nil, false
	case err != nil:
		// The permit failed for another reason than an outage of Redis
		// (the lock Client closed): unavailable, but a FailOpen route
		// does not run unguarded for it.
		endBegin(StepResult{Outcome: OutcomeUnavailable, Wait: waited, Err: err})
		g.metrics.redisDown.WithLabelValues(cl.method, cl.route, "closed").Inc()
		g.log.ErrorContext(cur, "guard: idempotency unavailable", "route", cl.route, "err", err)
		_ = c.Error(err)
		abort(c, answerIdemDown, r.retryAfter)
		return nil, false
	}
	// The rest of the chain runs with the request's current context,
	// cancelled when the permit is lost.
	ctx, cancel := context.WithCancelCause(cur)
	stop := context.AfterFunc(permit, func() { cancel(context.Cause(permit)) })
	cl.ctx = permit
	cl.release = func() {
		stop()
		cancel(nil)
		if uerr := sem.Release(permit); uerr != nil && !errors.Is(uerr, lock.ErrLost) {
			g.log.ErrorContext(st.base, "guard: releasing an idempotency key failed; it frees itself with its lease", "route", cl.route, "key", cl.recKey, "err", uerr)
		}
	}

	cl.marker = "p" + cl.fp + ":" + nonce()
	res, err := takeScript.Run(context.WithoutCancel(bg), g.rdb, []string{cl.recKey}, cl.marker, ic.ttl.Milliseconds()).Text()
	if err != nil && !errors.Is(err, redis.Nil) {
		cl.release()
		g.idemUnavailable(c, r, cl, err, endBegin, waited, run)
		return nil, false
	}
	if res != "" {
		// Completed while this request waited for the key.
		if rec, _, err := decodeRecord(res); err == nil && rec != nil {
			cl.release()
			endBegin(StepResult{Outcome: OutcomeReplay, Wait: waited})
			g.replay(c, rec, cl)
			return nil, false
		}
	}
	endBegin(StepResult{Outcome: OutcomeExecute, Wait: waited})
	return ctx, true
}

// permitFor takes a permit of sem for the request whose context is base,
// waiting at most wait. The permit must not end with the request: it holds
// the key until the request's record is settled, and a handler whose client
// went away may still be doing the work (a retry must not run it again
// meanwhile). The settling releases it; a dead instance's ends with its
// lease.
func permitFor(sem *lock.Semaphore, base context.Context, wait time.Duration) (context.Context, error) {
	return takeBeyond(base, context.WithoutCancel(base), func(ctx context.Context) (context.Context, error) {
		return sem.TryAcquire(ctx, wait)
	}, func(permit context.Context) { _ = sem.Release(permit) })
}

// idemUnavailable answers a request whose record or key Redis did not
// give; endBegin ends its StepIdempotencyBegin, which waited wait for the
// key. On a FailOpen route the rest of the chain runs without the key.
func (g *Guard) idemUnavailable(c *gin.Context, r *route, cl *claim, err error, endBegin func(StepResult), wait time.Duration, next func()) {
	res := StepResult{Wait: wait, Err: err}
	if c.Request.Context().Err() != nil {
		// The client went away during the call: Redis is not to blame.
		res.Outcome = OutcomeCancelled
		endBegin(res)
		abort(c, answerClientGone, r.retryAfter)
		return
	}
	if r.failOpen {
		res.Outcome = OutcomeFailOpen
		endBegin(res)
		g.metrics.redisDown.WithLabelValues(cl.method, cl.route, "open").Inc()
		g.log.WarnContext(c.Request.Context(), "guard: idempotency unavailable; the route fails open and runs unguarded", "route", cl.route, "err", err)
		next()
		return
	}
	res.Outcome = OutcomeUnavailable
	endBegin(res)
	g.metrics.redisDown.WithLabelValues(cl.method, cl.route, "closed").Inc()
	g.log.ErrorContext(c.Request.Context(), "guard: idempotency unavailable", "route", cl.route, "err", err)
	_ = c.Error(err)
	abort(c, answerIdemDown, r.retryAfter)
}

// replay answers with a stored response, or 422 when it was stored for a
// different request.
func (g *Guard) replay(c *gin.Context, rec *record, cl *claim) {
	_, end := g.step(c.Request.Context(), c, StepIdempotencyReplay, "")
	if rec.Fingerprint != cl.fp {
		g.metrics.idem.WithLabelValues(cl.method, cl.route, "mismatch").Inc()
		abort(c, answerKeyReused, 0)
		end(StepResult{Outcome: OutcomeMismatch, Status: http.StatusUnprocessableEntity})
		return
	}
	defer func() { end(StepResult{Outcome: OutcomeReplayed, Status: c.Writer.Status()}) }()
	g.metrics.idem.WithLabelValues(cl.method, cl.route, "replayed").Inc()
	resp := rec.response()
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	resp.Header.Set(ReplayedHeader, "true")
	ginmw.Replay(c, resp)
}

// settle decides what becomes of the request's record once its final
// answer is known, and then releases the claim: the handler's answer is
// stored for replay, or the marker is dropped so that a retry runs. Nothing
// is stored for an answer the framework gave itself (a later step refused
// the request, found the lock busy or Redis down, or the client went away
// while it waited), a panic, a transient status, a request whose lock was
// lost or whose write was refused as stale, one whose batch did not commit,
// or one whose own claim on the key ran out (a newer execution may have the
// key by now). Either is done only while the marker is still this
// execution's.
func (cl *claim) settle(c *gin.Context, st *request) {
	g, ic := cl.g, cl.ic
	defer cl.release()
	ctx, endStep := g.step(context.WithoutCancel(cl.ctx), c, StepIdempotencyFinish, "")
	res := StepResult{Outcome: OutcomeStored}
	defer func() { endStep(res) }()
	records := g.metrics.records
	resp, err := cl.rcd.Response(ic.replayHeaders...)
	switch {
	case st.panicked:
		res.Outcome = OutcomeDropped
		g.dropRecord(ctx, cl.recKey, cl.marker, cl.route)
		records.WithLabelValues(cl.method, cl.route, "dropped").Inc()
		return
	case err != nil:
		res = StepResult{Outcome: OutcomeNotStored, Err: err}
		g.log.WarnContext(ctx, "guard: response not stored for idempotent replay; a retry runs the request again",
			"route", cl.route, "reason", err)
		g.dropRecord(ctx, cl.recKey, cl.marker, cl.route)
		records.WithLabelValues(cl.method, cl.route, "not_stored").Inc()
		return
	case st.framework || st.unrepeatable || !storable(resp.Status, ic) || Lost(cl.ctx):
		res.Outcome = OutcomeDropped
		g.dropRecord(ctx, cl.recKey, cl.marker, cl.route)
		records.WithLabelValues(cl.method, cl.route, "dropped").Inc()
		return
	}
	data, err := encodeRecord(cl.fp, resp)
	var stored int64
	if err == nil {
		stored, err = finishScript.Run(ctx, g.rdb, []string{cl.recKey}, cl.marker, data, ic.ttl.Milliseconds()).Int64()
	}
	switch {
	case err != nil:
		res = StepResult{Outcome: OutcomeNotStored, Err: err}
		g.log.ErrorContext(ctx, "guard: storing an idempotent response failed; a retry runs the request again", "route", cl.route, "key", cl.recKey, "err", err)
		g.dropRecord(ctx, cl.recKey, cl.marker, cl.route)
		records.WithLabelValues(cl.method, cl.route, "not_stored").Inc()
	case stored == 0:
		res.Outcome = OutcomeNotStored
		g.log.WarnContext(ctx, "guard: response not stored: a newer execution took the idempotency key", "route", cl.route, "key", cl.recKey)
		records.WithLabelValues(cl.method, cl.route, "not_stored").Inc()
	default:
		records.WithLabelValues(cl.method, cl.route, "stored").Inc()
	}
}

// storable reports whether the handler's answer with status is replayed to
// retries: a 2xx or 3xx always; a 4xx only where the route keeps them (it
// says nothing happened, and a retry may succeed), never one that asks the
// client to try again; a 5xx only where the route keeps them.
func storable(status int, ic *idemConfig) bool {
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
			"route", routeName, "key", recKey, "err", err)
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

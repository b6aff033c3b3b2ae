package guard

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/ginmw"
)

// StatusClientClosedRequest is the status recorded for a request whose
// client went away while it waited (nginx's 499); nobody receives it.
const StatusClientClosedRequest = 499

// An answer is one of the answers the framework gives by itself, rather
// than the handler. Every one of them is written from the table below
// (answers), which is also the HTTP table of the README, and none is ever
// stored for idempotent replay: an idempotency step around it releases the
// key (or leaves it to the request that holds it), so that a retry runs.
type answer struct {
	status     int
	code       string // the "error" member; "" for an answer without a body (499)
	retryAfter bool   // with Retry-After: the route's RetryAfter
	// situation says when it is given, and key what becomes of the
	// request's idempotency key: the README's columns.
	situation string
	key       string
}

// What an answer does to the idempotency key of the request.
const (
	keyReleased = "released: a retry runs"
	keyKept     = "left to the request that holds it"
)

// The framework's own answers.
var (
	answerMissingField  = &answer{status: http.StatusBadRequest, code: "missing_field", situation: "a key field missing from the request (the answer names it: `\"field\"`)", key: keyReleased}
	answerUnsafeValue   = &answer{status: http.StatusBadRequest, code: "unsafe_value", situation: "a key field with a control character, a brace, invalid UTF-8 or over 128 bytes; never a Redis key built from it", key: keyReleased}
	answerBadBody       = &answer{status: http.StatusBadRequest, code: "bad_body", situation: "a body the key or the fingerprint cannot read (malformed JSON, members differing only in case)", key: keyReleased}
	answerBodyTooLarge  = &answer{status: http.StatusRequestEntityTooLarge, code: "body_too_large", situation: "a body over `guard.BodyLimit` (1 MiB default)", key: keyReleased}
	answerBodyTimeout   = &answer{status: http.StatusRequestTimeout, code: "body_timeout", situation: "a body not received within `guard.BodyTimeout` (5 s default)", key: keyReleased}
	answerRouteMismatch = &answer{status: http.StatusInternalServerError, code: "lock_route_mismatch", situation: "a lock template naming a `<path:x>` the route lacks (logged)", key: keyReleased}
	answerInternal      = &answer{status: http.StatusInternalServerError, code: "internal", situation: "a `<ctx:x>` value with no key form, or a key the lock refuses (logged)", key: keyReleased}
	answerBusy          = &answer{status: http.StatusTooManyRequests, code: "busy", retryAfter: true, situation: "the lock not acquired within the wait (2 s default; `guard.Busy` changes status and code)", key: keyReleased}
	answerLockDown      = &answer{status: http.StatusServiceUnavailable, code: "lock_unavailable", retryAfter: true, situation: "Redis unreachable while taking the lock (unless `guard.FailOpen()`)", key: keyReleased}
	answerIdemDown      = &answer{status: http.StatusServiceUnavailable, code: "idempotency_unavailable", retryAfter: true, situation: "Redis unreachable while claiming the idempotency key (unless `guard.FailOpen()`)", key: keyReleased}
	answerClientGone    = &answer{status: StatusClientClosedRequest, situation: "the client gone while the request waited (for the lock, in a combining line, for the key); nobody reads it", key: keyReleased}
	answerLockLost      = &answer{status: http.StatusConflict, code: "lock_lost", situation: "the lock lost while the handler ran (its context is cancelled with `lock.ErrLost`), if the handler wrote no answer; `guard.AbortStale`", key: keyReleased}
	answerStaleWrite    = &answer{status: http.StatusConflict, code: "stale_write", situation: "the handler's write refused as stale (`fencing.ErrStale`), reported with `guard.AbortStale` (or `c.Error` and no answer)", key: keyReleased}
	answerBatchFailed   = &answer{status: http.StatusServiceUnavailable, code: "batch_failed", retryAfter: true, situation: "a combining batch whose transaction failed to begin or to commit: every request of the batch", key: keyReleased}
	answerKeyMissing    = &answer{status: http.StatusBadRequest, code: "idempotency_key_missing", situation: "no `Idempotency-Key` where the key is required (the default)", key: keyReleased}
	answerKeyInvalid    = &answer{status: http.StatusBadRequest, code: "idempotency_key_invalid", situation: "an `Idempotency-Key` malformed, empty, non-ASCII or over 255 bytes", key: keyReleased}
	answerKeyReused     = &answer{status: http.StatusUnprocessableEntity, code: "idempotency_key_reused", situation: "the key used before with a request of another identity (from the record, or `guard.AbortKeyReused` from the database backstop)", key: keyKept}
	answerKeyInProgress = &answer{status: http.StatusConflict, code: "request_in_progress", retryAfter: true, situation: "the key's first request still running (or wait and replay: `guard.WaitForFirst`)", key: keyKept}
)

// answers is the table of the framework's own answers, in the README's
// order.
var answers = []*answer{
	answerMissingField, answerUnsafeValue, answerBadBody, answerBodyTooLarge, answerBodyTimeout,
	answerRouteMismatch, answerInternal, answerBusy, answerLockDown, answerIdemDown, answerClientGone,
	answerLockLost, answerStaleWrite, answerBatchFailed,
	answerKeyMissing, answerKeyInvalid, answerKeyReused, answerKeyInProgress,
}

// abort answers c with a, as the framework's own answer (see
// answeredByFramework); retryAfter is the route's RetryAfter. extra adds
// members to the body.
func abort(c *gin.Context, a *answer, retryAfter time.Duration, extra ...ginmw.AbortOption) {
	answeredByFramework(c)
	if a.code == "" {
		c.AbortWithStatus(a.status)
		return
	}
	if a.retryAfter {
		extra = append(extra, ginmw.RetryAfter(retryAfter))
	}
	ginmw.Abort(c, a.status, a.code, extra...)
}

// abortBusy answers c with the route's busy answer: answerBusy with the
// status and code Busy may have changed.
func abortBusy(c *gin.Context, r *route) {
	answeredByFramework(c)
	ginmw.Abort(c, r.busyStatus, r.busyCode, ginmw.RetryAfter(r.retryAfter))
}

// abortError answers c for err, an error of package ginmw (a key field or
// a body the request cannot be guarded with), as ginmw.AbortError writes
// it: the status and code of errorAnswer(err), with the field and a detail.
func abortError(c *gin.Context, err error) {
	answeredByFramework(c)
	ginmw.AbortError(c, err)
}

// reject answers a request that cannot be guarded (a bad key field, body or
// idempotency key).
func (g *Guard) reject(c *gin.Context, method, routeName string, err error) {
	g.metrics.rejected.WithLabelValues(method, routeName, rejectedLabel(err)).Inc()
	switch a := errorAnswer(err); a {
	case answerKeyMissing:
		abort(c, a, 0)
	case answerKeyInvalid:
		abort(c, a, 0, ginmw.Extra("detail", err.Error()))
	default:
		abortError(c, err)
	}
}

// errorAnswer returns the answer to a request refused with err, an error of
// package ginmw or an idempotency key's.
func errorAnswer(err error) *answer {
	if errors.Is(err, errIdemKey) {
		if errors.Is(err, errMissingKey) {
			return answerKeyMissing
		}
		return answerKeyInvalid
	}
	switch ginmw.Code(err) {
	case answerBodyTooLarge.code:
		return answerBodyTooLarge
	case answerMissingField.code:
		return answerMissingField
	case answerUnsafeValue.code:
		return answerUnsafeValue
	case answerBadBody.code:
		return answerBadBody
	}
	return answerInternal
}

// rejectedLabel names err for the rejected_total metric: the answer's code,
// with one value for every refused idempotency key.
func rejectedLabel(err error) string {
	if errors.Is(err, errIdemKey) {
		return "idempotency_key"
	}
	return errorAnswer(err).code
}

// answeredByFramework marks the request as answered by the framework
// itself, not by the handler: its idempotency record is not stored, and a
// key it claimed is released at once, so that a retry runs.
func answeredByFramework(c *gin.Context) {
	if st := stateOf(c); st != nil {
		st.framework = true
	}
}

// answersTable renders answers as the README's Markdown table.
func answersTable() string {
	var b strings.Builder
	b.WriteString("| situation | status | `error` | `Retry-After` | stored | the idempotency key |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, a := range answers {
		code, ra := "(no body)", ""
		if a.code != "" {
			code = "`" + a.code + "`"
		}
		if a.retryAfter {
			ra = "yes"
		}
		b.WriteString("| " + a.situation + " | " + strconv.Itoa(a.status) + " | " + code + " | " + ra + " | never | " + a.key + " |\n")
	}
	return b.String()
}

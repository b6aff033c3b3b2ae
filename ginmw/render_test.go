package ginmw

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// serveAbort serves a request whose first handler is h and whose second
// must not run.
func serveAbort(t *testing.T, h gin.HandlerFunc) *httptest.ResponseRecorder {
	t.Helper()
	r := gin.New()
	r.GET("/", h, func(c *gin.Context) { t.Error("the chain went on after Abort") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	return w
}

func TestAbort_WritesErrorFirstThenExtrasInOrder(t *testing.T) {
	w := serveAbort(t, func(c *gin.Context) {
		Abort(c, http.StatusTooManyRequests, "busy",
			Extra("key", "sku:42"), Extra("wait_ms", 2000), Extra("error", "ignored"),
			Extra("key", "ignored too"), Extra("bad", func() {}), Header("X-Guard", "lock"))
	})
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", w.Code)
	}
	if got, want := w.Body.String(), `{"error":"busy","key":"sku:42","wait_ms":2000}`; got != want {
		t.Fatalf("body %s, want %s", got, want)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	if w.Header().Get("X-Guard") != "lock" {
		t.Fatalf("headers %v", w.Header())
	}
}

func TestAbort_EscapesCodesAndNamesIntoValidJSON(t *testing.T) {
	code := "we\"ird\\\n\x00\xff\u2028"
	w := serveAbort(t, func(c *gin.Context) { Abort(c, http.StatusBadRequest, code, Extra("n\"ame", "v")) })
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("body %q is not JSON: %v", w.Body, err)
	}
	if got["error"] != "we\"ird\\\n\x00\uFFFD\u2028" || got["n\"ame"] != "v" {
		t.Fatalf("decoded %q", got)
	}
}

func TestRetryAfter_WholeSecondsRoundedUpAtLeastOne(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:            "1",
		0:                       "1",
		time.Millisecond:        "1",
		time.Second:             "1",
		time.Second + 1:         "2",
		1200 * time.Millisecond: "2",
		2 * time.Second:         "2",
		90 * time.Second:        "90",
	} {
		w := serveAbort(t, func(c *gin.Context) { Abort(c, http.StatusTooManyRequests, "busy", RetryAfter(d)) })
		if got := w.Header().Get("Retry-After"); got != want {
			t.Errorf("RetryAfter(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestAbort_AfterTheResponseStartedOnlyStopsTheChain(t *testing.T) {
	w := serveAbort(t, func(c *gin.Context) {
		c.String(http.StatusOK, "partial")
		Abort(c, http.StatusConflict, "lost")
	})
	if w.Code != http.StatusOK || w.Body.String() != "partial" {
		t.Fatalf("got %d %q", w.Code, w.Body)
	}
}

func TestAbortError_MapsEachErrorToItsAnswer(t *testing.T) {
	fieldErr := func(sentinel error, reason string) error {
		return &FieldError{Field: Field{SourceBody, "order.sku"}, Err: sentinel, Reason: reason}
	}
	tests := []struct {
		err    error
		status int
		body   string
	}{
		{fieldErr(ErrMissingField, "not in the body"), 400, `{"error":"missing_field","field":"order.sku","detail":"not in the body"}`},
		{fieldErr(ErrUnsafeValue, "value longer than 128 bytes"), 400, `{"error":"unsafe_value","field":"order.sku","detail":"value longer than 128 bytes"}`},
		{fieldErr(fmt.Errorf("%w: JSON body is not an object", ErrBadBody), "bad body: JSON body is not an object"), 400, `{"error":"bad_body","field":"order.sku","detail":"bad body: JSON body is not an object"}`},
		{fieldErr(fmt.Errorf("%w: more than 10 bytes", ErrBodyTooLarge), "body too large"), 413, `{"error":"body_too_large"}`},
		{fmt.Errorf("%w: more than 10 bytes", ErrBodyTooLarge), 413, `{"error":"body_too_large"}`},
		{fmt.Errorf("%w: reading: unexpected EOF", ErrBadBody), 400, `{"error":"bad_body","detail":"bad body: reading: unexpected EOF"}`},
		{fieldErr(fmt.Errorf("%w struct {}", ErrValueType), "unsupported value type struct {}"), 500, `{"error":"internal"}`},
		{errors.New("redis: connection refused"), 500, `{"error":"internal"}`},
	}
	for _, tt := range tests {
		var recorded []*gin.Error
		w := serveAbort(t, func(c *gin.Context) {
			AbortError(c, tt.err)
			recorded = c.Errors
		})
		if w.Code != tt.status || w.Body.String() != tt.body {
			t.Errorf("AbortError(%v): %d %s, want %d %s", tt.err, w.Code, w.Body, tt.status, tt.body)
		}
		if Status(tt.err) != tt.status {
			t.Errorf("Status(%v) = %d, want %d", tt.err, Status(tt.err), tt.status)
		}
		if len(recorded) != 1 || recorded[0].Err != tt.err {
			t.Errorf("AbortError(%v) put %v on the context", tt.err, recorded)
		}
	}
}

func TestAbortError_AnswersAResolveFailureEndToEnd(t *testing.T) {
	tpl := MustParseTemplate("sku:<id>")
	r := gin.New()
	r.POST("/sku", func(c *gin.Context) {
		if _, err := tpl.Resolve(c, 0); err != nil {
			AbortError(c, err)
		}
	}, func(c *gin.Context) { t.Error("handler ran") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, jsonPost("/sku", `{"id":"a\nb"}`))
	if w.Code != 400 || w.Body.String() != `{"error":"unsafe_value","field":"id","detail":"value contains a control character"}` {
		t.Fatalf("got %d %s", w.Code, w.Body)
	}
}

package ginmw_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/ginmw"
)

// TestProblemJSON_RendersRFC9457 answers a busy request through the
// problem renderer: the media type, the standard members, the code, the
// detail and the extension members, and the headers kept.
func TestProblemJSON_RendersRFC9457(t *testing.T) {
	for _, tc := range []struct {
		base, wantType string
	}{
		{"", "about:blank"},
		{"https://errors.example.com/", "https://errors.example.com/busy"},
	} {
		r := gin.New()
		r.Use(ginmw.UseRenderer(ginmw.ProblemJSON(tc.base)))
		r.GET("/x", func(c *gin.Context) {
			ginmw.Abort(c, http.StatusTooManyRequests, "busy", ginmw.RetryAfter(2*time.Second),
				ginmw.Extra("detail", "the lock was not free within 2s"), ginmw.Extra("field", "sku"),
				ginmw.Extra("status", 200), ginmw.Extra("bad", func() {}))
		})
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
		if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("Content-Type %q, want application/problem+json", ct)
		}
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" {
			t.Errorf("status %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
		}
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %s: %v", rec.Body, err)
		}
		want := map[string]any{
			"type": tc.wantType, "title": "Too Many Requests", "status": float64(429),
			"detail": "the lock was not free within 2s", "code": "busy", "field": "sku",
		}
		if len(body) != len(want) {
			t.Errorf("body %s, want exactly %v", rec.Body, want)
		}
		for k, v := range want {
			if body[k] != v {
				t.Errorf("%q = %v, want %v (body %s)", k, body[k], v, rec.Body)
			}
		}
	}
}

// TestAbort_DefaultRendererIsTheJSONShape: without a renderer, and with
// SetRenderer(nil), answers keep {"error": code, ...}.
func TestAbort_DefaultRendererIsTheJSONShape(t *testing.T) {
	r := gin.New()
	r.GET("/x", func(c *gin.Context) {
		ginmw.SetRenderer(c, nil)
		ginmw.Abort(c, http.StatusBadRequest, "missing_field", ginmw.Extra("field", "id"))
	})
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	if got := rec.Body.String(); got != `{"error":"missing_field","field":"id"}` || rec.Header().Get("Content-Type") != "application/json; charset=utf-8" {
		t.Errorf("default answer %s (%s)", got, rec.Header().Get("Content-Type"))
	}
}

package ginmw

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// rewindBody is a request body that is rewound between iterations without
// allocating.
type rewindBody struct {
	data []byte
	off  int
}

func (b *rewindBody) Read(p []byte) (int, error) {
	if b.off >= len(b.data) {
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	return n, nil
}

func (*rewindBody) Close() error { return nil }

// discardWriter is an http.ResponseWriter that costs nothing.
type discardWriter struct{ h http.Header }

func (w discardWriter) Header() http.Header       { return w.h }
func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) WriteHeader(int)             {}

var benchKey string

// benchServe serves req through engine b.N times; resolve is false for the
// baseline of the same engine without resolving.
func benchServe(b *testing.B, tmpl, route string, req *http.Request, mw gin.HandlerFunc, resolve bool) {
	tpl := MustParseTemplate(tmpl)
	r := gin.New()
	handler := func(c *gin.Context) {
		if !resolve {
			return
		}
		key, err := tpl.Resolve(c, 0)
		if err != nil {
			b.Fatal(err)
		}
		benchKey = key
	}
	if mw != nil {
		r.Handle(req.Method, route, mw, handler)
	} else {
		r.Handle(req.Method, route, handler)
	}
	w := discardWriter{h: http.Header{}}
	body, _ := req.Body.(*rewindBody)
	b.ReportAllocs()
	for b.Loop() {
		if body != nil {
			body.off = 0
			req.Body = body // Resolve put a reader over the cached bytes there
		}
		r.ServeHTTP(w, req)
	}
}

// BenchmarkResolve measures a whole request through a gin engine, with and
// without resolving a template; the difference is the cost of the
// template, including reading and checking the body.
func BenchmarkResolve(b *testing.B) {
	pathReq := func() *http.Request { return httptest.NewRequest(http.MethodGet, "/sku/42", nil) }
	const orderJSON = `{"order_no":"N20240601-0001","sku":"s-42","qty":1,"address":{"city":"Hangzhou","line":"1 West Lake Rd"}}`
	bodyReq := func() *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/order", nil)
		req.Header.Set("Content-Type", "application/json")
		req.Body, req.ContentLength = &rewindBody{data: []byte(orderJSON)}, int64(len(orderJSON))
		return req
	}
	setUser := func(c *gin.Context) { c.Set("user_id", "u-1001") }

	b.Run("path/baseline", func(b *testing.B) { benchServe(b, "sku:<id>", "/sku/:id", pathReq(), nil, false) })
	b.Run("path/sku:<id>", func(b *testing.B) { benchServe(b, "sku:<id>", "/sku/:id", pathReq(), nil, true) })
	b.Run("body/baseline", func(b *testing.B) {
		benchServe(b, "order:<ctx:user_id>:<body:order_no>", "/order", bodyReq(), setUser, false)
	})
	b.Run("body/order:<ctx:user_id>:<body:order_no>", func(b *testing.B) {
		benchServe(b, "order:<ctx:user_id>:<body:order_no>", "/order", bodyReq(), setUser, true)
	})
}

// BenchmarkAbort_Busy measures the answer a busy request gets.
func BenchmarkAbort_Busy(b *testing.B) {
	r := gin.New()
	r.GET("/", func(c *gin.Context) {
		Abort(c, http.StatusTooManyRequests, "busy", RetryAfter(2*time.Second))
	})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		r.ServeHTTP(w, req)
	}
}

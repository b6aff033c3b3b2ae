package ginmw

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// jsonOfSize returns a JSON object of exactly n bytes: {"sku":"s-1","pad":"xxx…"}.
func jsonOfSize(n int) []byte {
	head := `{"sku":"s-1","pad":"`
	return []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)
}

// formOfSize returns an urlencoded form of exactly n bytes: sku=s-1&pad=xxx…
func formOfSize(n int) []byte {
	head := "sku=s-1&pad="
	return []byte(head + strings.Repeat("x", n-len(head)))
}

// unknownLength hides the body's length from the server, as a chunked
// request would.
func unknownLength(req *http.Request) *http.Request {
	req.ContentLength = -1
	req.Body = io.NopCloser(struct{ io.Reader }{req.Body})
	return req
}

func TestBody_ExactlyTheLimitPassesAndTheHandlerBindsTheWholeJSON(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		body := jsonOfSize(DefaultBodyLimit)
		req := jsonPost("/o", string(body))
		if chunked {
			req = unknownLength(req)
		}
		var bound struct{ SKU, Pad string }
		var bindErr error
		o := resolveOn(t, "k:<body:sku>", "/o", req, nil, func(c *gin.Context) { bindErr = c.ShouldBindJSON(&bound) })
		wantKey(t, o, "k:s-1")
		if bindErr != nil || bound.SKU != "s-1" || len(bound.Pad) != DefaultBodyLimit-22 {
			t.Fatalf("chunked=%v: handler ShouldBindJSON = %v, pad of %d bytes", chunked, bindErr, len(bound.Pad))
		}
	}
}

func TestBody_ExactlyTheLimitPassesAndTheHandlerReadsTheWholeForm(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		req := formPost(http.MethodPost, "/o", string(formOfSize(DefaultBodyLimit)))
		if chunked {
			req = unknownLength(req)
		}
		var pad string
		o := resolveOn(t, "k:<body:sku>", "/o", req, nil, func(c *gin.Context) { pad = c.PostForm("pad") })
		wantKey(t, o, "k:s-1")
		if len(pad) != DefaultBodyLimit-12 {
			t.Fatalf("chunked=%v: handler c.PostForm(pad) has %d bytes", chunked, len(pad))
		}
	}
}

func TestBody_OneByteOverTheLimitIsTooLarge(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		req := jsonPost("/o", string(jsonOfSize(DefaultBodyLimit+1)))
		if chunked {
			req = unknownLength(req)
		}
		o := resolve(t, "k:<body:sku>", "/o", req)
		fe := wantFieldErr(t, o, "<body:sku>", ErrBodyTooLarge)
		if Status(o.err) != http.StatusRequestEntityTooLarge {
			t.Errorf("Status = %d, want 413", Status(o.err))
		}
		if fe.Reason != "body too large: more than 1048576 bytes" {
			t.Errorf("Reason = %q", fe.Reason)
		}
	}
}

func TestBody_ConfiguredLimitAppliesToResolve(t *testing.T) {
	tpl := MustParseTemplate("k:<body:sku>")
	var errs []error
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		_, err := tpl.Resolve(c, 64)
		errs = append(errs, err)
	})
	r.ServeHTTP(httptest.NewRecorder(), jsonPost("/o", string(jsonOfSize(64))))
	r.ServeHTTP(httptest.NewRecorder(), jsonPost("/o", string(jsonOfSize(65))))
	if errs[0] != nil || !errors.Is(errs[1], ErrBodyTooLarge) {
		t.Fatalf("64-byte limit: errors %v", errs)
	}
}

func TestBody_DeclaredLengthOverTheLimitFailsWithoutReading(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/o", nil)
	req.Body = failingBody{t}
	req.ContentLength = DefaultBodyLimit + 1
	r := gin.New()
	var err error
	r.POST("/o", func(c *gin.Context) { _, err = Body(c, 0) })
	r.ServeHTTP(httptest.NewRecorder(), req)
	if !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("Body = %v, want ErrBodyTooLarge", err)
	}
}

func TestBody_TooLargeBodyStillReadsWhole(t *testing.T) {
	body := jsonOfSize(100)
	req := unknownLength(jsonPost("/o", string(body)))
	var err error
	var rest []byte
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		_, err = Body(c, 10)
		rest, _ = io.ReadAll(c.Request.Body)
	})
	r.ServeHTTP(httptest.NewRecorder(), req)
	if !errors.Is(err, ErrBodyTooLarge) || !bytes.Equal(rest, body) {
		t.Fatalf("Body = %v; body afterwards %q", err, rest)
	}
}

func TestBody_MaxBytesReaderTrippingIsTooLarge(t *testing.T) {
	var err error
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, 10)
		_, err = Body(c, 0)
	})
	r.ServeHTTP(httptest.NewRecorder(), unknownLength(jsonPost("/o", string(jsonOfSize(100)))))
	if !errors.Is(err, ErrBodyTooLarge) || Status(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("Body = %v, want ErrBodyTooLarge", err)
	}
}

// brokenBody returns some bytes, then an error, as a client that goes away.
type brokenBody struct{ sent bool }

func (b *brokenBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, `{"sku":`), nil
	}
	return 0, io.ErrUnexpectedEOF
}
func (*brokenBody) Close() error { return nil }

func TestBody_ReadFailureIsBadBodyWithTheCause(t *testing.T) {
	req := jsonPost("/o", "")
	req.Body, req.ContentLength = &brokenBody{}, -1
	o := resolve(t, "k:<body:sku>", "/o", req)
	wantFieldErr(t, o, "<body:sku>", ErrBadBody)
	if !errors.Is(o.err, io.ErrUnexpectedEOF) || Status(o.err) != http.StatusBadRequest {
		t.Fatalf("error %v does not wrap the cause or Status = %d", o.err, Status(o.err))
	}
}

func TestBody_ReadOnceSameBytesEveryCall(t *testing.T) {
	reads := 0
	req := jsonPost("/o", "")
	req.Body = countingBody{r: strings.NewReader(`{"a":1}`), n: &reads}
	var first, second []byte
	var handlerRead []byte
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		first, _ = Body(c, 0)
		readsAfterFirst := reads
		second, _ = Body(c, 0)
		if reads != readsAfterFirst {
			t.Errorf("second Body call read the original body again")
		}
		handlerRead, _ = io.ReadAll(c.Request.Body)
	})
	r.ServeHTTP(httptest.NewRecorder(), req)
	if string(first) != `{"a":1}` || &first[0] != &second[0] || string(handlerRead) != `{"a":1}` {
		t.Fatalf("Body = %q then %q; handler read %q", first, second, handlerRead)
	}
}

func TestBody_SmallerLimitOnALaterCallIsTooLarge(t *testing.T) {
	var err1, err2 error
	r := gin.New()
	r.POST("/o", func(c *gin.Context) {
		_, err1 = Body(c, 100)
		_, err2 = Body(c, 10)
	})
	r.ServeHTTP(httptest.NewRecorder(), jsonPost("/o", string(jsonOfSize(50))))
	if err1 != nil || !errors.Is(err2, ErrBodyTooLarge) {
		t.Fatalf("Body(100) = %v, Body(10) = %v", err1, err2)
	}
}

func TestBody_RequestWithoutBodyIsEmpty(t *testing.T) {
	var b []byte
	err := errors.New("not called")
	r := gin.New()
	r.GET("/o", func(c *gin.Context) { b, err = Body(c, 0) })
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/o", nil))
	if err != nil || len(b) != 0 {
		t.Fatalf("Body = %q, %v", b, err)
	}
}

func TestBody_FormParsedFromTheCacheMatchesPostForm(t *testing.T) {
	form := url.Values{"sku": {"a&b=c"}, "x": {"1", "2"}}.Encode()
	var body []byte
	var postForm string
	o := resolveOn(t, "k:<body:sku>", "/o", formPost(http.MethodPut, "/o", form), nil, func(c *gin.Context) {
		body, _ = Body(c, 0)
		postForm = c.PostForm("sku")
	})
	wantKey(t, o, "k:a&b=c")
	if string(body) != form || postForm != "a&b=c" {
		t.Fatalf("Body = %q, handler PostForm = %q", body, postForm)
	}
}

func TestBody_LimitBeyondMaxBodyLimitCountsAsMaxBodyLimit(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		var got []byte
		var err error
		r := gin.New()
		r.POST("/o", func(c *gin.Context) { got, err = Body(c, math.MaxInt64) })
		req := jsonPost("/o", `{"sku":"s-1"}`)
		if chunked {
			req = unknownLength(req)
		}
		r.ServeHTTP(httptest.NewRecorder(), req)
		if err != nil || string(got) != `{"sku":"s-1"}` {
			t.Fatalf("chunked=%v: Body(c, MaxInt64) = %q, %v", chunked, got, err)
		}
	}
	req := jsonPost("/o", "{}")
	req.ContentLength = MaxBodyLimit + 1
	var err error
	r := gin.New()
	r.POST("/o", func(c *gin.Context) { _, err = Body(c, math.MaxInt64) })
	r.ServeHTTP(httptest.NewRecorder(), req)
	if !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("a declared length over MaxBodyLimit: %v, want ErrBodyTooLarge", err)
	}
}

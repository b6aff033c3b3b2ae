package ginmw

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/textproto"

	"github.com/gin-gonic/gin"
)

// DefaultRecordLimit is the largest response body a Recorder keeps when
// Record is given a limit of 0 or less: 64 KiB.
const DefaultRecordLimit = 64 << 10

// Recorder is a gin.ResponseWriter that passes everything through to the
// client unchanged while keeping a copy of the response: its status, the
// headers as they were when they went out, and the body up to a limit.
// Status, Size, Written, WriteHeaderNow, Flush, Hijack, CloseNotify and
// Pusher behave exactly as those of the writer it wraps. A Recorder is for
// the goroutine serving the request, like the writer it wraps.
type Recorder struct {
	gin.ResponseWriter
	limit    int
	body     []byte
	header   http.Header // snapshot taken when the headers were sent; nil before
	over     bool
	hijacked bool
}

var _ gin.ResponseWriter = (*Recorder)(nil)

// Record installs a Recorder as c.Writer, so that everything written after
// this call, by later middleware and the handler, is recorded, and returns
// it. A body longer than limit bytes (limit <= 0 means DefaultRecordLimit)
// is still sent in full but not kept: Response then reports
// ErrResponseTooLarge.
func Record(c *gin.Context, limit int) *Recorder {
	if limit <= 0 {
		limit = DefaultRecordLimit
	}
	r := &Recorder{ResponseWriter: c.Writer, limit: limit}
	c.Writer = r
	return r
}

// snapshot keeps the headers that are about to be sent.
func (r *Recorder) snapshot() {
	if r.header == nil && !r.ResponseWriter.Written() {
		r.header = r.ResponseWriter.Header().Clone()
	}
}

// room reports whether n more bytes fit the record, and gives the record
// up when they do not.
func (r *Recorder) room(n int) bool {
	if r.over || n == 0 {
		return false
	}
	if len(r.body)+n > r.limit {
		r.over = true
		r.body = nil
		return false
	}
	return true
}

// Write sends data to the client and keeps a copy of what was sent.
func (r *Recorder) Write(data []byte) (int, error) {
	r.snapshot()
	n, err := r.ResponseWriter.Write(data)
	if r.room(n) {
		r.body = append(r.body, data[:n]...)
	}
	return n, err
}

// WriteString sends s to the client and keeps a copy of what was sent.
func (r *Recorder) WriteString(s string) (int, error) {
	r.snapshot()
	n, err := r.ResponseWriter.WriteString(s)
	if r.room(n) {
		r.body = append(r.body, s[:n]...)
	}
	return n, err
}

// WriteHeaderNow sends the status and headers if they have not been sent.
func (r *Recorder) WriteHeaderNow() {
	r.snapshot()
	r.ResponseWriter.WriteHeaderNow()
}

// Flush sends the headers if needed and flushes buffered data to the
// client; streamed responses are recorded like any other.
func (r *Recorder) Flush() {
	r.snapshot()
	r.ResponseWriter.Flush()
}

// Hijack takes over the connection; the response can no longer be recorded
// and Response reports ErrHijacked.
func (r *Recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := r.ResponseWriter.Hijack()
	if err == nil {
		r.hijacked = true
	}
	return conn, rw, err
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (r *Recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Exceeded reports whether the body grew beyond the limit, so the response
// will not be kept.
func (r *Recorder) Exceeded() bool { return r.over }

// Response is a recorded HTTP response, the unit of idempotent replay.
type Response struct {
	Status int         // 0 means 200
	Header http.Header // only the headers chosen to be replayed
	Body   []byte      // the body as sent
}

// Response returns what was sent so far: the status, the body, and of the
// headers as sent (or as they stand, if nothing was sent yet) Content-Type
// and the headers named in keep. Call it after the handler returned. It
// fails with ErrResponseTooLarge when the body exceeded the limit and with
// ErrHijacked when the handler took over the connection. The returned
// Body is the Recorder's own buffer.
func (r *Recorder) Response(keep ...string) (Response, error) {
	switch {
	case r.hijacked:
		return Response{}, ErrHijacked
	case r.over:
		return Response{}, fmt.Errorf("%w: body over %d bytes", ErrResponseTooLarge, r.limit)
	}
	sent := r.header
	if sent == nil {
		sent = r.ResponseWriter.Header()
	}
	h := http.Header{}
	copyHeader(h, sent, "Content-Type")
	for _, name := range keep {
		copyHeader(h, sent, name)
	}
	return Response{Status: r.Status(), Header: h, Body: r.body}, nil
}

func copyHeader(dst, src http.Header, name string) {
	name = textproto.CanonicalMIMEHeaderKey(name)
	if vs, ok := src[name]; ok && len(vs) > 0 {
		dst[name] = append([]string(nil), vs...)
	}
}

// Replay writes a recorded response to c — its headers (replacing values of
// the same name already set), status and body — and aborts the handler
// chain, so the handler does not run again. It must be called before
// anything was written to c; when something was, it only aborts.
func Replay(c *gin.Context, resp Response) {
	c.Abort()
	if c.Writer.Written() {
		return
	}
	h := c.Writer.Header()
	for name, vs := range resp.Header {
		h[name] = append([]string(nil), vs...)
	}
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	c.Writer.WriteHeader(status)
	if len(resp.Body) == 0 {
		c.Writer.WriteHeaderNow()
		return
	}
	_, _ = c.Writer.Write(resp.Body)
}

package guard

import (
	"bufio"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
)

// A heldWriter is the gin.ResponseWriter of a request in a batch: it keeps
// the handler's answer (status, body; headers go to the real writer's map,
// which is not sent) until the batch is over, and then sends it (release)
// or throws it away (discard), so that no client is told of a purchase
// whose batch did not commit. It is for the request's goroutine only.
type heldWriter struct {
	gin.ResponseWriter // the real writer, restored afterwards
	c                  *gin.Context
	header             http.Header // the headers as they were before the handler
	status             int
	wrote              bool
	body               []byte
}

var _ gin.ResponseWriter = (*heldWriter)(nil)

// holdAnswer installs a heldWriter as c.Writer.
func holdAnswer(c *gin.Context) *heldWriter {
	w := &heldWriter{ResponseWriter: c.Writer, c: c, header: c.Writer.Header().Clone(), status: http.StatusOK}
	c.Writer = w
	return w
}

func (w *heldWriter) WriteHeader(code int) {
	if code > 0 && !w.wrote {
		w.status = code
	}
}

func (w *heldWriter) WriteHeaderNow() { w.wrote = true }

func (w *heldWriter) Write(data []byte) (int, error) {
	w.wrote = true
	w.body = append(w.body, data...)
	return len(data), nil
}

func (w *heldWriter) WriteString(s string) (int, error) {
	w.wrote = true
	w.body = append(w.body, s...)
	return len(s), nil
}

func (w *heldWriter) Status() int { return w.status }
func (w *heldWriter) Size() int {
	if !w.wrote {
		return -1
	}
	return len(w.body)
}
func (w *heldWriter) Written() bool { return w.wrote }

// Flush does nothing: the answer waits for the batch.
func (w *heldWriter) Flush() {}

// Hijack is refused: a batch's answers are held until it commits.
func (w *heldWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errHijackInBatch
}

var errHijackInBatch = errors.New("guard: a combined request cannot hijack its connection")

// release sends the held answer and gives c its writer back.
func (w *heldWriter) release() {
	real := w.ResponseWriter
	w.c.Writer = real
	if !w.wrote {
		// The handler wrote nothing: what it set stays for the middleware
		// around, as on a Lock route.
		if w.status != http.StatusOK {
			real.WriteHeader(w.status)
		}
		return
	}
	real.WriteHeader(w.status)
	if len(w.body) == 0 {
		real.WriteHeaderNow()
		return
	}
	_, _ = real.Write(w.body)
}

// discard throws the held answer away, headers included, and gives c its
// writer back.
func (w *heldWriter) discard() {
	if w == nil {
		return
	}
	w.c.Writer = w.ResponseWriter
	h := w.ResponseWriter.Header()
	for k := range h {
		delete(h, k)
	}
	for k, vs := range w.header {
		h[k] = vs
	}
}

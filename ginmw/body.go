package ginmw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"
)

// DefaultBodyLimit is the body limit used when a limit of 0 or less is
// given to Body or Template.Resolve: 1 MiB.
const DefaultBodyLimit = 1 << 20

// MaxBodyLimit is the largest body limit: a body is held in memory whole, so
// the limit bounds what one request can make the process allocate. A larger
// limit given to Body or Template.Resolve counts as MaxBodyLimit. 1 GiB.
const MaxBodyLimit = 1 << 30

// Body returns the request body, reading it on the first call of the
// request and returning the same bytes on later calls, so the lock key, the
// idempotency key and the idempotency fingerprint all see one body.
//
// The first read consumes at most limit+1 bytes (limit <= 0 means
// DefaultBodyLimit, a limit over MaxBodyLimit means MaxBodyLimit) and then puts the body back: c.Request.Body is replaced
// by a reader over the same bytes, so the handler, c.ShouldBindJSON and
// c.PostForm read it as if it had never been touched. A body longer than
// limit is ErrBodyTooLarge (a declared Content-Length over the limit fails
// without reading anything; an http.MaxBytesReader installed earlier that
// trips also counts); the part already read is put back in front of the
// rest, so the body still reads whole. A read that fails otherwise (the
// client went away) is ErrBadBody wrapping the cause.
//
// The first read's outcome is kept for the request: a later call with a
// larger limit does not read further, a later call with a smaller limit
// than the body's length fails with ErrBodyTooLarge. A request without a
// body gives an empty slice and no error. The returned bytes are shared and
// must not be modified.
func Body(c *gin.Context, limit int64) ([]byte, error) {
	return requestOf(c).readBody(c.Request, limit)
}

// stateKey is the gin context key of the per-request state.
type stateKey struct{}

// requestState is what this package keeps on a gin context for one
// request: the body, read once, and the body parsed once.
type requestState struct {
	read    bool
	body    []byte
	readErr error
	replay  replayBody // the body put back; part of the state to save an allocation

	parsed   bool
	parseErr error
	kind     bodyKind
	empty    bool       // no body, or a JSON body of whitespace only
	form     url.Values // bodyForm and bodyMultipart: the fields c.PostForm sees
}

type bodyKind uint8

const (
	bodyJSON      bodyKind = iota // any content type but the two form types, as c.ShouldBindJSON ignores it
	bodyForm                      // application/x-www-form-urlencoded
	bodyMultipart                 // multipart/form-data
)

func requestOf(c *gin.Context) *requestState {
	if v, ok := c.Get(stateKey{}); ok {
		if s, ok := v.(*requestState); ok {
			return s
		}
	}
	s := new(requestState)
	c.Set(stateKey{}, s)
	return s
}

func (s *requestState) readBody(req *http.Request, limit int64) ([]byte, error) {
	if limit <= 0 {
		limit = DefaultBodyLimit
	}
	limit = min(limit, MaxBodyLimit)
	if !s.read {
		s.read = true
		s.body, s.readErr = readAndRestore(req, limit, &s.replay)
	}
	if s.readErr != nil {
		return nil, s.readErr
	}
	if int64(len(s.body)) > limit {
		return nil, tooLarge(limit)
	}
	return s.body, nil
}

func tooLarge(limit int64) error {
	return fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
}

// replayBody is the request body put back after reading.
type replayBody struct{ bytes.Reader }

func (*replayBody) Close() error { return nil }

// prefixedBody is a body of which a prefix was read: it yields the prefix,
// then the rest of the original body.
type prefixedBody struct {
	io.Reader
	io.Closer
}

func readAndRestore(req *http.Request, limit int64, rb *replayBody) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	// With a known length, one allocation holds the body and the spare
	// byte that the read reporting EOF (or an overflow) lands in.
	size := int64(512)
	if req.ContentLength >= 0 {
		size = req.ContentLength + 1
	}
	buf := make([]byte, 0, min(size, limit+1))
	var err error
	for int64(len(buf)) <= limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		end := min(int64(cap(buf)), limit+1)
		var n int
		n, err = req.Body.Read(buf[len(buf):end])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	if err == io.EOF {
		err = nil
	}
	if int64(len(buf)) > limit || err != nil {
		req.Body = &prefixedBody{io.MultiReader(bytes.NewReader(buf), req.Body), req.Body}
		if maxBytes := (*http.MaxBytesError)(nil); int64(len(buf)) > limit || errors.As(err, &maxBytes) {
			return nil, tooLarge(limit)
		}
		return nil, fmt.Errorf("%w: reading: %w", ErrBadBody, err)
	}
	rb.Reset(buf)
	req.Body = rb
	return buf, nil
}

// parseBody reads the body and prepares it for field lookups, once per
// request: a JSON body is checked (and must be an object), a form body is
// parsed into the values c.PostForm sees.
func (s *requestState) parseBody(req *http.Request, limit int64) error {
	body, err := s.readBody(req, limit)
	if err != nil {
		return err
	}
	if s.parsed {
		return s.parseErr
	}
	s.parsed = true
	s.kind = kindOf(req.Header.Get("Content-Type"))
	if len(body) == 0 {
		s.empty = true
		return nil
	}
	switch s.kind {
	case bodyJSON:
		i := skipWS(body, 0)
		if i == len(body) {
			s.empty = true
			return nil
		}
		if off, ok := checkJSON(body); !ok {
			s.parseErr = fmt.Errorf("%w: not valid JSON (error at byte %d)", ErrBadBody, off)
		} else if body[i] != '{' {
			s.parseErr = fmt.Errorf("%w: JSON body is not an object", ErrBadBody)
		}
	case bodyForm:
		// Like http.Request.ParseForm, which c.PostForm uses: only
		// POST, PUT and PATCH bodies carry form fields, and the fields
		// before a malformed pair still count.
		switch req.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			s.form, _ = url.ParseQuery(string(body))
		}
	case bodyMultipart:
		s.form, s.parseErr = parseMultipart(body, req.Header.Get("Content-Type"))
	}
	return s.parseErr
}

// kindOf classifies a body by its Content-Type. Everything that is not one
// of the two form types is read as JSON, because gin's JSON binding does
// not look at the Content-Type either.
func kindOf(contentType string) bodyKind {
	mt := contentType
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = mt[:i]
	}
	mt = strings.TrimSpace(mt)
	switch {
	case strings.EqualFold(mt, "application/x-www-form-urlencoded"):
		return bodyForm
	case strings.EqualFold(mt, "multipart/form-data"):
		return bodyMultipart
	}
	return bodyJSON
}

// parseMultipart returns the non-file fields of a multipart/form-data body,
// the values c.PostForm sees.
func parseMultipart(body []byte, contentType string) (url.Values, error) {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil || params["boundary"] == "" {
		return nil, fmt.Errorf("%w: multipart body without a boundary", ErrBadBody)
	}
	form := url.Values{}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return form, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: malformed multipart: %w", ErrBadBody, err)
		}
		name := p.FormName()
		if name == "" || p.FileName() != "" {
			continue
		}
		v, err := io.ReadAll(p)
		if err != nil {
			return nil, fmt.Errorf("%w: malformed multipart: %w", ErrBadBody, err)
		}
		form[name] = append(form[name], string(v))
	}
}

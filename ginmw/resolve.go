package ginmw

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
)

// Resolve fills the template's fields from the request and returns the key.
//
// Each field's value must be present and non-empty and pass the safety
// rules of the package (see MaxValueLen); the error is a *FieldError naming
// the field, and Status maps it to the HTTP answer. Values are used as sent,
// except that a field followed by another field has '%' and the first
// character of the literal text after it percent-escaped, so that no two
// different requests share a key by accident (order:<a>:<b> with a="1:2"
// gives "order:1%3A2:…").
//
// Where values come from:
//   - path and query: c.Param and the first c.Query value.
//   - header: the first value of the header.
//   - ctx: c.Get; strings, []byte, integers, bools, finite floats and
//     fmt.Stringers are accepted (see ErrValueType); nil counts as missing.
//   - body: read at most once per request with bodyLimit (<= 0 means
//     DefaultBodyLimit, see Body) and only when a body field is reached.
//     A JSON body is checked once and must be an object; a path names
//     object members the way encoding/json matches struct fields (case-
//     insensitive; a member present twice is ErrBadBody) and decimal
//     segments index arrays. A JSON string gives its unescaped text, true
//     and false give "true" and "false", an integer its digits ("-0" →
//     "0"), any other number its shortest decimal form without exponent
//     (42.0 and 4.2e1 → "42"); null counts as missing; an object or array
//     is ErrUnsafeValue. A form body (urlencoded or multipart) gives the
//     first value c.PostForm would; the field name is used whole, dots
//     included.
//   - <name> without a source: the path parameter if the route has one,
//     else the query parameter if present, else the top-level body field.
//     The first source that has the field decides, even if its value is
//     unusable.
//
// Besides the body buffer and the per-request state (once per request, and
// only when a body field is reached) and gin's own query cache, Resolve
// allocates only the returned string in the common cases: path, query,
// header, ctx strings and integers, JSON strings without escapes.
//
// The zero Template resolves to an error matching ErrBadTemplate (status
// 500), never to an empty key.
func (t *Template) Resolve(c *gin.Context, bodyLimit int64) (string, error) {
	if t == nil || len(t.parts) == 0 {
		return "", fmt.Errorf("%w: zero Template; use ParseTemplate", ErrBadTemplate)
	}
	var buf [256]byte
	b := buf[:0]
	for i := range t.parts {
		p := &t.parts[i]
		b = append(b, p.lit...)
		if p.field < 0 {
			break
		}
		var err error
		if b, err = t.appendField(b, c, p, bodyLimit); err != nil {
			return "", err
		}
	}
	return string(b), nil
}

func (t *Template) appendField(b []byte, c *gin.Context, p *part, bodyLimit int64) ([]byte, error) {
	f := &t.fields[p.field]
	switch f.Source {
	case SourcePath:
		v, ok := c.Params.Get(f.Name)
		if !ok {
			return b, missing(f, "no such path parameter")
		}
		return appendChecked(b, v, p, f)
	case SourceQuery:
		v, ok := query(c, f.Name)
		if !ok {
			return b, missing(f, "not in the query string")
		}
		return appendChecked(b, v, p, f)
	case SourceHeader:
		if f.Name == "Host" { // net/http moves it out of Header
			if c.Request.Host == "" {
				return b, missing(f, "header not sent")
			}
			return appendChecked(b, c.Request.Host, p, f)
		}
		vs := c.Request.Header[f.Name]
		if len(vs) == 0 {
			return b, missing(f, "header not sent")
		}
		return appendChecked(b, vs[0], p, f)
	case SourceCtx:
		return appendCtx(b, c, p, f)
	case SourceBody:
		return appendBody(b, c, p, f, bodyLimit, "not in the body")
	default: // SourceAny
		if v, ok := c.Params.Get(f.Name); ok {
			return appendChecked(b, v, p, f)
		}
		if v, ok := query(c, f.Name); ok {
			return appendChecked(b, v, p, f)
		}
		const reason = "not in path, query or body"
		if !hasBody(c) {
			return b, missing(f, reason)
		}
		return appendBody(b, c, p, f, bodyLimit, reason)
	}
}

// query is c.GetQuery without building gin's query cache for a request
// that has no query string.
func query(c *gin.Context, name string) (string, bool) {
	if c.Request.URL == nil || c.Request.URL.RawQuery == "" {
		return "", false
	}
	return c.GetQuery(name)
}

// hasBody reports whether the request may have a body to look into.
func hasBody(c *gin.Context) bool {
	if v, ok := c.Get(stateKey{}); ok {
		if s, ok := v.(*requestState); ok && s.read {
			return len(s.body) > 0 || s.readErr != nil
		}
	}
	body := c.Request.Body
	return body != nil && body != http.NoBody
}

func appendChecked[T string | []byte](b []byte, v T, p *part, f *Field) ([]byte, error) {
	b, problem := appendValue(b, v, p.esc)
	switch problem {
	case valueOK:
		return b, nil
	case valueEmpty:
		return b, missing(f, problem.reason())
	}
	return b, unsafe(f, problem.reason())
}

func appendCtx(b []byte, c *gin.Context, p *part, f *Field) ([]byte, error) {
	v, ok := c.Get(f.Name)
	if !ok || v == nil {
		return b, missing(f, "not set on the request context")
	}
	var num [32]byte
	s, bs, isBytes, err := ctxValue(v, num[:0])
	if err != nil {
		return b, &FieldError{Field: *f, Err: err, Reason: strings.TrimPrefix(err.Error(), "ginmw: ")}
	}
	if isBytes {
		return appendChecked(b, bs, p, f)
	}
	return appendChecked(b, s, p, f)
}

func appendBody(b []byte, c *gin.Context, p *part, f *Field, limit int64, absent string) ([]byte, error) {
	s := requestOf(c)
	if err := s.parseBody(c.Request, limit); err != nil {
		return b, &FieldError{Field: *f, Err: err, Reason: strings.TrimPrefix(err.Error(), "ginmw: ")}
	}
	if s.empty {
		return b, missing(f, absent)
	}
	if s.kind != bodyJSON {
		vs := s.form[f.Name]
		if len(vs) == 0 {
			return b, missing(f, absent)
		}
		return appendChecked(b, vs[0], p, f)
	}
	v, status, depth := jsonFind(s.body, p.path)
	switch status {
	case notFound:
		return b, missing(f, absent)
	case ambiguous:
		return b, &FieldError{Field: *f, Err: ErrBadBody,
			Reason: "body has member \"" + strings.Join(p.path[:depth+1], ".") + "\" more than once (keys that differ only in case count as the same)"}
	}
	switch v.kind {
	case jsonString:
		raw := s.body[v.start+1 : v.end-1]
		if !v.escaped {
			return appendChecked(b, raw, p, f)
		}
		// An escape is at most 6 bytes for 1, so a longer raw string
		// cannot unescape to an acceptable value.
		if len(raw) > 6*MaxValueLen {
			return b, unsafe(f, valueTooLong.reason())
		}
		var unesc [6 * MaxValueLen]byte
		return appendChecked(b, unescapeJSON(unesc[:0], raw), p, f)
	case jsonNumber:
		if v.end-v.start > MaxValueLen {
			return b, unsafe(f, valueTooLong.reason())
		}
		var num [64]byte
		n, ok := appendNumber(num[:0], s.body[v.start:v.end])
		if !ok {
			return b, unsafe(f, "number out of range")
		}
		return appendChecked(b, n, p, f)
	case jsonTrue:
		return appendChecked(b, "true", p, f)
	case jsonFalse:
		return appendChecked(b, "false", p, f)
	case jsonNull:
		return b, missing(f, "value is null")
	}
	return b, unsafe(f, "value is "+v.kind.String()+", not a string, number or boolean")
}

func missing(f *Field, reason string) error {
	return &FieldError{Field: *f, Err: ErrMissingField, Reason: reason}
}

func unsafe(f *Field, reason string) error {
	return &FieldError{Field: *f, Err: ErrUnsafeValue, Reason: reason}
}

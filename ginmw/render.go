package ginmw

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// AbortOption adds an extra JSON member or a header to an answer written by
// Abort. Build it with Extra, Header or RetryAfter.
type AbortOption struct {
	name   string
	value  any
	header bool
}

// Extra adds the member name: value to the JSON body, after "error" and in
// the order given. The value is encoded with encoding/json; a value it
// cannot encode is left out, and so are the name "error" and a name given
// twice (the first wins), so the body is always valid JSON with unique
// names.
func Extra(name string, value any) AbortOption {
	return AbortOption{name: name, value: value}
}

// Header sets the response header name to value.
func Header(name, value string) AbortOption {
	return AbortOption{name: name, value: value, header: true}
}

// RetryAfter sets the Retry-After header to d in whole seconds, rounded
// up, and at least 1: a client told "retry after 0" would retry at once.
func RetryAfter(d time.Duration) AbortOption {
	secs := int64(1)
	if d > time.Second {
		secs = int64((d + time.Second - 1) / time.Second)
	}
	return Header("Retry-After", strconv.FormatInt(secs, 10))
}

// Abort stops the handler chain and answers with status and the JSON body
// {"error": code, ...extra members}, with Content-Type application/json.
// Every JSON answer of the framework goes through it, so clients see one
// shape. If the response was already written (a handler streamed
// something), Abort only stops the chain: a second body cannot be sent.
//
// A Renderer set for the request (UseRenderer, SetRenderer) writes the body
// instead, for example as RFC 9457 problem details (ProblemJSON).
func Abort(c *gin.Context, status int, code string, opts ...AbortOption) {
	c.Abort()
	if c.Writer.Written() {
		return
	}
	var members []Member
	h := c.Writer.Header()
	for i, o := range opts {
		if o.header {
			h.Set(o.name, o.value.(string))
			continue
		}
		if o.name == "error" || extraSeen(opts[:i], o.name) {
			continue
		}
		members = append(members, Member{Name: o.name, Value: o.value})
	}
	render := JSONRenderer
	if r, ok := c.Get(rendererKey); ok {
		render = r.(Renderer)
	}
	render(c, status, code, members)
}

// JSONRenderer is the default Renderer: {"error": code, ...members}, with
// Content-Type application/json. A member whose value encoding/json cannot
// encode is left out, so the body is always valid JSON.
func JSONRenderer(c *gin.Context, status int, code string, members []Member) {
	buf := make([]byte, 0, 64)
	buf = append(buf, `{"error":`...)
	buf = appendJSONString(buf, code)
	for _, m := range members {
		buf = appendMember(buf, m)
	}
	buf = append(buf, '}')
	c.Data(status, "application/json; charset=utf-8", buf)
}

// appendMember appends ,"name":value to a JSON object being built; a value
// encoding/json cannot encode is left out, so the object stays valid JSON.
func appendMember(buf []byte, m Member) []byte {
	v, err := json.Marshal(m.Value)
	if err != nil {
		return buf
	}
	buf = append(buf, ',')
	buf = appendJSONString(buf, m.Name)
	buf = append(buf, ':')
	return append(buf, v...)
}

func extraSeen(opts []AbortOption, name string) bool {
	for _, o := range opts {
		if !o.header && o.name == name {
			return true
		}
	}
	return false
}

// AbortError answers a request that failed with err, an error of this
// package (from Template.Resolve or Body), and records err on the context
// (c.Error) for logging middleware. The status is Status(err); the body is
//
//	400 {"error":"missing_field"|"unsafe_value"|"bad_body", "field":"order.sku", "detail":"value longer than 128 bytes"}
//	413 {"error":"body_too_large"}
//	500 {"error":"internal"}
//
// "field" appears when a template field is concerned; "detail" never quotes
// a request value. A 500 says nothing more to the client: it is a server
// bug, and err is on the context for the logs.
func AbortError(c *gin.Context, err error) {
	_ = c.Error(err)
	status := Status(err)
	if status != http.StatusBadRequest {
		Abort(c, status, Code(err))
		return
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		Abort(c, status, Code(err), Extra("field", fe.Field.Name), Extra("detail", fe.Reason))
		return
	}
	Abort(c, status, Code(err), Extra("detail", strings.TrimPrefix(err.Error(), "ginmw: ")))
}

// appendJSONString appends s as a JSON string, escaping what JSON requires
// and replacing invalid UTF-8 with U+FFFD, as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, `\u202`...)
			dst = append(dst, hex[r&0xF])
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

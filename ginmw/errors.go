package ginmw

import (
	"errors"
	"net/http"
	"strconv"
)

// Sentinel errors. Errors returned by this package wrap exactly one of them,
// so callers branch with errors.Is and map to HTTP statuses with [Status].
var (
	// ErrBadTemplate is wrapped by every template syntax error (a
	// *TemplateError). It is a programming error found at registration.
	ErrBadTemplate = errors.New("ginmw: bad template")

	// ErrMissingField means a template field has no value in the request
	// (absent, empty, or JSON null). Status 400.
	ErrMissingField = errors.New("ginmw: missing field")

	// ErrUnsafeValue means a field's value cannot become part of a key: it
	// contains a control character, a brace or invalid UTF-8, is longer than
	// MaxValueLen bytes, or is a JSON object or array. Status 400.
	ErrUnsafeValue = errors.New("ginmw: unsafe value")

	// ErrBadBody means the body was needed and could not be used: it is not
	// valid JSON, not a JSON object, names a field twice, is malformed
	// multipart, or reading it failed. Status 400.
	ErrBadBody = errors.New("ginmw: bad body")

	// ErrBodyTooLarge means the body is longer than the configured limit.
	// Status 413.
	ErrBodyTooLarge = errors.New("ginmw: body too large")

	// ErrValueType means a value an earlier middleware put on the gin
	// context (a <ctx:...> field) has a type, or a float value, that has no
	// key form. It is a server-side programming error. Status 500.
	ErrValueType = errors.New("ginmw: unsupported value type")

	// ErrResponseTooLarge is returned by Recorder.Response when the handler
	// wrote more than the recorder's limit; the response reached the client
	// but was not kept.
	ErrResponseTooLarge = errors.New("ginmw: response too large to record")

	// ErrHijacked is returned by Recorder.Response when the handler took
	// over the connection; such a response cannot be replayed.
	ErrHijacked = errors.New("ginmw: response hijacked")
)

// TemplateError describes a template syntax error. It matches
// ErrBadTemplate under errors.Is.
type TemplateError struct {
	Template string // the template as given
	Column   int    // 1-based column (in characters) of the problem; len+1 means "at the end"
	Reason   string // what is wrong there
}

// Error returns a message that shows the template and the column, e.g.
// `ginmw: template "sku:<id" column 5: unclosed "<"`.
func (e *TemplateError) Error() string {
	return "ginmw: template " + strconv.Quote(e.Template) + " column " + strconv.Itoa(e.Column) + ": " + e.Reason
}

// Unwrap returns ErrBadTemplate.
func (e *TemplateError) Unwrap() error { return ErrBadTemplate }

// FieldError describes why a template field could not be resolved against
// a request. Err is, or wraps, one of ErrMissingField, ErrUnsafeValue,
// ErrBadBody, ErrBodyTooLarge or ErrValueType, and errors.Is sees through
// it. Reason never quotes the request's value, so it is safe to show to
// the client.
type FieldError struct {
	Field  Field  // the field as written in the template
	Err    error  // the sentinel, possibly wrapped with a cause
	Reason string // e.g. "not found in path, query or body", "value longer than 128 bytes"
}

// Error returns e.g. `ginmw: field <body:order.sku>: value contains a control character`.
func (e *FieldError) Error() string {
	return "ginmw: field " + e.Field.String() + ": " + e.Reason
}

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Status returns the HTTP status a request failing with err deserves:
// 413 for ErrBodyTooLarge; 400 for ErrMissingField, ErrUnsafeValue and
// ErrBadBody; 500 for everything else, including ErrValueType (a server
// bug, not the client's fault) and errors of other packages.
func Status(err error) int {
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrMissingField), errors.Is(err, ErrUnsafeValue), errors.Is(err, ErrBadBody):
		return http.StatusBadRequest
	default:
		return http.StatusInternalServerError
	}
}

// Code returns the "error" member AbortError writes for err:
// "body_too_large", "missing_field", "unsafe_value", "bad_body", or
// "internal" for everything else.
func Code(err error) string {
	switch {
	case errors.Is(err, ErrBodyTooLarge):
		return "body_too_large"
	case errors.Is(err, ErrMissingField):
		return "missing_field"
	case errors.Is(err, ErrUnsafeValue):
		return "unsafe_value"
	case errors.Is(err, ErrBadBody):
		return "bad_body"
	default:
		return "internal"
	}
}

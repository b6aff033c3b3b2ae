// Package ginmw holds the Gin mechanics that the guard middleware is built
// from: key templates resolved against a request, a bounded request body that
// is read once and put back, a response recorder for idempotent replay, and
// the one function every JSON error answer goes through.
//
// # Key templates
//
// A template is literal text with fields in angle brackets:
//
//	sku:<id>                          <id>: path parameter, else query, else body
//	order:<ctx:user_id>:<body:order_no>
//	{user:<ctx:user_id>}:order        braces in literal text make a Redis Cluster hash tag
//
// Templates are parsed once, when a route is registered ([ParseTemplate],
// [MustParseTemplate]), and resolved per request ([Template.Resolve]). A
// value taken from a request never carries a control character, a brace or
// invalid UTF-8 into a key, and is at most [MaxValueLen] bytes long; a
// request whose value breaks these rules is refused with an error that names
// the field, so a client can never choose, split or merge another client's
// key.
//
// # Errors and HTTP statuses
//
// Every error of this package wraps one of its sentinels; [Status] maps an
// error to the HTTP status the guard answers with, and [AbortError] writes
// that answer:
//
//	ErrMissingField, ErrUnsafeValue, ErrBadBody  400 Bad Request
//	ErrBodyTooLarge                              413 Request Entity Too Large
//	ErrValueType and anything else               500 Internal Server Error
//
// # Concurrency
//
// A [Template] is immutable and safe for concurrent use by any number of
// requests. The per-request state this package keeps on a *gin.Context (the
// body and what was parsed from it) is, like the gin.Context itself, for the
// goroutine serving the request.
package ginmw

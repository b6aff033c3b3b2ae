package guard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/url"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/ginmw"
)

// A Fingerprint says what of a request's body decides that two requests
// with the same idempotency key are "the same request". The rest of the
// request's identity always counts: its method, route template, path
// parameters, query (parameters in any order of names and any escaping,
// each name's values in their order) and the media type of its
// Content-Type.
type Fingerprint struct {
	mode   fingerprintMode
	fields []string
}

type fingerprintMode uint8

const (
	fpAuto fingerprintMode = iota
	fpRaw
	fpJSON
	fpFields
)

var (
	// FingerprintAuto hashes a JSON body (by Content-Type) in canonical form
	// (ginmw.CanonicalJSON: member order and whitespace do not matter, a
	// body binds like its canonical form, an object with two members whose
	// names differ only in case is answered 400) and any other body byte for
	// byte. The default.
	FingerprintAuto = Fingerprint{mode: fpAuto}
	// FingerprintRaw hashes the body byte for byte.
	FingerprintRaw = Fingerprint{mode: fpRaw}
	// FingerprintJSON requires a JSON body and hashes it in canonical form;
	// a body that is not JSON is answered 400.
	FingerprintJSON = Fingerprint{mode: fpJSON}
)

// FingerprintFields hashes only the named fields of a JSON body (dotted
// paths, e.g. "order.sku"), so that fields a client may legitimately vary
// between retries (a timestamp, a nonce) do not count; only those fields are
// canonicalised (ginmw.CanonicalJSONFields). Members are found by name as
// encoding/json matches struct fields, under case folding. A body that is
// not JSON, or whose path names two members, is answered 400; a field that
// is absent counts as null.
func FingerprintFields(paths ...string) Fingerprint {
	mustf(len(paths) > 0, "FingerprintFields needs at least one field")
	for _, p := range paths {
		mustf(p != "" && !strings.HasPrefix(p, ".") && !strings.HasSuffix(p, ".") && !strings.Contains(p, ".."),
			"FingerprintFields(%q): not a dotted path", p)
	}
	return Fingerprint{mode: fpFields, fields: append([]string(nil), paths...)}
}

// errNotJSON is the refusal of a body that a JSON fingerprint cannot read.
var errNotJSON = errors.New("guard: the JSON fingerprint refuses the body")

// sum returns the fingerprint of a request's identity: its method, route
// template, path parameters, query, media type and body (as the mode reads
// it). Every part is length-prefixed, so that no two identities run into
// one another.
func (f Fingerprint) sum(c *gin.Context, route string, body []byte) (string, error) {
	h := sha256.New()
	var num [20]byte
	part := func(s string) {
		h.Write(strconv.AppendInt(num[:0], int64(len(s)), 10))
		h.Write([]byte{':'})
		io.WriteString(h, s)
	}
	req := c.Request
	part(req.Method)
	part(route)
	part(strconv.Itoa(len(c.Params)))
	for _, p := range c.Params {
		part(p.Key)
		part(p.Value)
	}
	part(canonicalQuery(req.URL.RawQuery))
	contentType := req.Header.Get("Content-Type")
	part(mediaType(contentType))
	mode := f.mode
	if mode == fpAuto {
		mode = fpRaw
		if isJSON(contentType) && len(bytes.TrimSpace(body)) > 0 {
			mode = fpJSON
		}
	}
	switch mode {
	case fpRaw:
		h.Write([]byte{'r'})
		h.Write(body)
	case fpJSON:
		h.Write([]byte{'j'})
		if err := ginmw.CanonicalJSON(h, body); err != nil {
			return "", fmt.Errorf("%w: %w", errNotJSON, err)
		}
	case fpFields:
		h.Write([]byte{'f'})
		if err := ginmw.CanonicalJSONFields(h, body, f.fields); err != nil {
			return "", fmt.Errorf("%w: %w", errNotJSON, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// canonicalQuery returns the query as a handler reads it: the same
// parameters with the same values in the same order give the same text,
// however they were escaped and in whatever order the names came. A query
// that url.ParseQuery refuses in part (gin would drop those pairs) counts
// byte for byte.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return "\x00" + raw
	}
	return v.Encode() // names sorted, each name's values in their order
}

// mediaType returns the media type of a Content-Type, in lower case and
// without parameters (charset and the like), or the header as sent when it
// does not parse.
func mediaType(contentType string) string {
	if contentType == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "\x00" + contentType
	}
	return mt
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

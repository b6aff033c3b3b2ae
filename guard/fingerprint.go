package guard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/url"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
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
	// — key order and whitespace do not matter — and any other body byte for
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
// between retries (a timestamp, a nonce) do not count. A body that is not
// JSON is answered 400; a field that is absent counts as null.
func FingerprintFields(paths ...string) Fingerprint {
	mustf(len(paths) > 0, "FingerprintFields needs at least one field")
	for _, p := range paths {
		mustf(p != "" && !strings.HasPrefix(p, ".") && !strings.HasSuffix(p, ".") && !strings.Contains(p, ".."),
			"FingerprintFields(%q): not a dotted path", p)
	}
	return Fingerprint{mode: fpFields, fields: append([]string(nil), paths...)}
}

// errNotJSON is the refusal of a body that a JSON fingerprint cannot read.
var errNotJSON = errors.New("guard: the body is not JSON")

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
	case fpJSON, fpFields:
		h.Write([]byte{'j'})
		v, err := decodeJSON(body)
		if err != nil {
			return "", err
		}
		if mode == fpFields {
			picked := make([]any, len(f.fields))
			for i, p := range f.fields {
				picked[i] = pick(v, p)
			}
			v = picked
		}
		canonical, err := json.Marshal(v) // maps are written with sorted keys
		if err != nil {
			return "", fmt.Errorf("%w: %v", errNotJSON, err)
		}
		h.Write(canonical)
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

// decodeJSON parses one JSON value, keeping numbers as written.
func decodeJSON(body []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", errNotJSON, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: text after the JSON value", errNotJSON)
	}
	return v, nil
}

// pick returns the value at a dotted path, or nil.
func pick(v any, path string) any {
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[seg]
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

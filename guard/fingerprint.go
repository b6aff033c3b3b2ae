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
	"strconv"
	"strings"
)

// A Fingerprint says what of a request decides that two requests with the
// same idempotency key are "the same request". The method and the route
// template always count.
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

// sum returns the fingerprint of a request.
func (f Fingerprint) sum(method, route, contentType string, body []byte) (string, error) {
	h := sha256.New()
	io.WriteString(h, method)
	h.Write([]byte{0})
	io.WriteString(h, route)
	h.Write([]byte{0})
	mode := f.mode
	if mode == fpAuto {
		mode = fpRaw
		if isJSON(contentType) && len(bytes.TrimSpace(body)) > 0 {
			mode = fpJSON
		}
	}
	switch mode {
	case fpRaw:
		h.Write(body)
	case fpJSON, fpFields:
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

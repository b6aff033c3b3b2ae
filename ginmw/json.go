package ginmw

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON bodies are checked once per request (checkJSON) and then searched in
// place (jsonFind) instead of being decoded into map[string]any: no
// reflection, no allocation except to unescape a string that has escapes,
// and no memory amplification on large bodies.
//
// The lookup mirrors what a handler binding the body with encoding/json
// (c.ShouldBindJSON into a struct) sees: object keys are unescaped and
// matched case-insensitively. A key that occurs twice on the path, also in
// different case ({"sku":"a","SKU":"b"}), is refused as ErrBadBody: the
// handler would act on one value while the key was built from the other.

// maxJSONDepth bounds nesting, like encoding/json.
const maxJSONDepth = 10000

type jsonKind uint8

const (
	jsonString jsonKind = iota + 1
	jsonNumber
	jsonTrue
	jsonFalse
	jsonNull
	jsonObject
	jsonArray
)

func (k jsonKind) String() string {
	switch k {
	case jsonString:
		return "a string"
	case jsonNumber:
		return "a number"
	case jsonTrue, jsonFalse:
		return "a boolean"
	case jsonNull:
		return "null"
	case jsonObject:
		return "an object"
	case jsonArray:
		return "an array"
	}
	return "nothing"
}

// jsonValue is a value inside a checked document: b[start:end] is its text
// (strings with their quotes).
type jsonValue struct {
	kind       jsonKind
	start, end int
	escaped    bool // string with at least one backslash escape
}

// checkJSON reports whether b is exactly one JSON value (RFC 8259) with
// optional surrounding whitespace, and otherwise the offset of the first
// byte that is wrong. It accepts what encoding/json's Valid accepts.
func checkJSON(b []byte) (int, bool) {
	i := skipWS(b, 0)
	i, ok := checkValue(b, i, 0)
	if !ok {
		return i, false
	}
	if i = skipWS(b, i); i != len(b) {
		return i, false
	}
	return 0, true
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func checkValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; c {
	case '{', '[':
		if depth >= maxJSONDepth {
			return i, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return i, false
				}
				if i, ok = checkString(b, i); !ok {
					return i, false
				}
				if i = skipWS(b, i); i >= len(b) || b[i] != ':' {
					return i, false
				}
				i = skipWS(b, i+1)
			}
			if i, ok = checkValue(b, i, depth+1); !ok {
				return i, false
			}
			if i = skipWS(b, i); i >= len(b) {
				return i, false
			}
			switch b[i] {
			case ',':
				i = skipWS(b, i+1)
			case closer:
				return i + 1, true
			default:
				return i, false
			}
		}
	case '"':
		return checkString(b, i)
	case 't':
		return checkLiteral(b, i, "true")
	case 'f':
		return checkLiteral(b, i, "false")
	case 'n':
		return checkLiteral(b, i, "null")
	default:
		return checkNumber(b, i)
	}
}

func checkLiteral(b []byte, i int, lit string) (int, bool) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) || b[i+k] != lit[k] {
			return i + k, false
		}
	}
	return i + len(lit), true
}

// checkString checks the string starting at the quote b[i].
func checkString(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for k := 1; k <= 4; k++ {
					if i+k >= len(b) || !isHex(b[i+k]) {
						return i + k, false
					}
				}
				i += 4
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		}
	}
	return i, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// checkNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func checkNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, false
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return i, false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	return i, true
}

// The functions below work on checked documents only.

// valueAt returns the value that starts at b[i].
func valueAt(b []byte, i int) jsonValue {
	switch b[i] {
	case '"':
		end, esc := skipString(b, i)
		return jsonValue{kind: jsonString, start: i, end: end, escaped: esc}
	case '{':
		return jsonValue{kind: jsonObject, start: i, end: skipContainer(b, i)}
	case '[':
		return jsonValue{kind: jsonArray, start: i, end: skipContainer(b, i)}
	case 't':
		return jsonValue{kind: jsonTrue, start: i, end: i + 4}
	case 'f':
		return jsonValue{kind: jsonFalse, start: i, end: i + 5}
	case 'n':
		return jsonValue{kind: jsonNull, start: i, end: i + 4}
	}
	j := i + 1
	for j < len(b) {
		switch b[j] {
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '.', 'e', 'E', '+', '-':
			j++
			continue
		}
		break
	}
	return jsonValue{kind: jsonNumber, start: i, end: j}
}

// skipString returns the offset after the string starting at the quote
// b[i], and whether it has escapes.
func skipString(b []byte, i int) (int, bool) {
	esc := false
	for i++; ; i++ {
		switch b[i] {
		case '"':
			return i + 1, esc
		case '\\':
			esc = true
			i++ // the escaped byte is never the closing quote
		}
	}
}

// skipContainer returns the offset after the object or array at b[i].
func skipContainer(b []byte, i int) int {
	depth := 0
	for ; ; i++ {
		switch b[i] {
		case '"':
			i, _ = skipString(b, i)
			i--
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
}

// findStatus is the outcome of jsonFind.
type findStatus uint8

const (
	found     findStatus = iota
	notFound             // a segment names nothing
	ambiguous            // a segment names two members
)

// jsonFind follows path from the top-level value of the checked document b
// and returns the value found, or why there is none and at which segment
// (an index into path).
func jsonFind(b []byte, path []string) (jsonValue, findStatus, int) {
	v := valueAt(b, skipWS(b, 0))
	for d, seg := range path {
		var next jsonValue
		switch v.kind {
		case jsonObject:
			n := 0
			for i := skipWS(b, v.start+1); b[i] != '}'; {
				key := valueAt(b, i)
				i = skipWS(b, key.end)
				i = skipWS(b, i+1) // ':'
				val := valueAt(b, i)
				if keyMatches(b[key.start+1:key.end-1], key.escaped, seg) {
					n++
					next = val
				}
				if i = skipWS(b, val.end); b[i] == ',' {
					i = skipWS(b, i+1)
				}
			}
			if n == 0 {
				return v, notFound, d
			}
			if n > 1 {
				return v, ambiguous, d
			}
		case jsonArray:
			idx, ok := arrayIndex(seg)
			if !ok {
				return v, notFound, d
			}
			i := skipWS(b, v.start+1)
			for n := 0; ; n++ {
				if b[i] == ']' {
					return v, notFound, d
				}
				val := valueAt(b, i)
				if n == idx {
					next = val
					break
				}
				if i = skipWS(b, val.end); b[i] == ',' {
					i = skipWS(b, i+1)
				}
			}
		default:
			return v, notFound, d
		}
		v = next
	}
	return v, found, len(path)
}

// arrayIndex parses a path segment as an array index: a decimal number
// without leading zeros.
func arrayIndex(seg string) (int, bool) {
	if seg == "" || len(seg) > 9 || (seg[0] == '0' && len(seg) > 1) {
		return 0, false
	}
	n := 0
	for i := 0; i < len(seg); i++ {
		if !isDigit(seg[i]) {
			return 0, false
		}
		n = n*10 + int(seg[i]-'0')
	}
	return n, true
}

// keyMatches reports whether the raw (quoted-content) key equals seg the
// way encoding/json matches a key to a struct field: after unescaping,
// under Unicode case folding.
func keyMatches(raw []byte, escaped bool, seg string) bool {
	if escaped {
		var buf [64]byte
		raw = unescapeJSON(buf[:0], raw)
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] >= utf8.RuneSelf {
			// Non-ASCII keys can still fold to ASCII (the Kelvin sign
			// K folds to k); rare enough to pay for the conversion.
			return bytes.EqualFold(raw, []byte(seg))
		}
	}
	if len(raw) != len(seg) {
		return false
	}
	for i := 0; i < len(raw); i++ {
		a, b := raw[i], seg[i]
		if a != b && lower(a) != lower(b) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// unescapeJSON appends the unescaped content of a checked string (without
// its quotes) to dst, turning lone surrogates into U+FFFD as
// encoding/json does.
func unescapeJSON(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2 = hex4(raw[i+2 : i+6])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r = dec
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendNumber appends the key form of a checked JSON number: an integer
// as written ("-0" as "0"); any other number as the shortest decimal of its
// float64 value without exponent, so 42, 42.0 and 4.2e1 give the same key
// (they are the same value to a handler binding a float). A number beyond
// the float64 range is refused.
func appendNumber(dst, raw []byte) ([]byte, bool) {
	if bytes.IndexAny(raw, ".eE") < 0 {
		if string(raw) == "-0" {
			return append(dst, '0'), true
		}
		return append(dst, raw...), true
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return dst, false
	}
	if f == 0 {
		f = 0 // -0
	}
	return strconv.AppendFloat(dst, f, 'f', -1, 64), true
}

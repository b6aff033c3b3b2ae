package guard

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxIdempotencyKeyLen is the longest Idempotency-Key accepted, in bytes of
// the key itself (without the quotes of a structured-field string).
const MaxIdempotencyKeyLen = 255

// errIdemKey is wrapped by every refusal of an Idempotency-Key header.
var errIdemKey = errors.New("guard: bad idempotency key")

// parseIdempotencyKey reads the Idempotency-Key header: exactly one field
// line holding either a structured-field string ("8e03978e-...", RFC 8941
// §3.3.3: printable ASCII, with \" and \\ escapes) or a bare key made of
// token characters, ':' and '/' (RFC 8941 §3.3.4, except that a bare key may
// start with a digit: most clients send bare UUIDs). Parameters and lists
// are refused, and so are empty and overlong keys.
func parseIdempotencyKey(lines []string) (string, error) {
	if len(lines) != 1 {
		return "", fmt.Errorf("%w: the header must be sent once, got %d lines", errIdemKey, len(lines))
	}
	v := strings.Trim(lines[0], " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", errIdemKey)
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		for ; i < len(v); i++ {
			ch := v[i]
			if ch == '\\' {
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", fmt.Errorf("%w: a backslash in a string must escape '\"' or '\\\\'", errIdemKey)
				}
				b.WriteByte(v[i])
				continue
			}
			if ch == '"' {
				break
			}
			if ch < 0x20 || ch > 0x7e {
				return "", fmt.Errorf("%w: only printable ASCII is allowed", errIdemKey)
			}
			b.WriteByte(ch)
		}
		if i >= len(v) {
			return "", fmt.Errorf("%w: unterminated string", errIdemKey)
		}
		if i != len(v)-1 {
			return "", fmt.Errorf("%w: unexpected text after the string (parameters and lists are not accepted)", errIdemKey)
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if !isTokenChar(v[i]) {
				return "", fmt.Errorf("%w: character %s not allowed in a token (quote the key)", errIdemKey, charAt(v, i))
			}
		}
		key = v
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty", errIdemKey)
	case len(key) > MaxIdempotencyKeyLen:
		return "", fmt.Errorf("%w: longer than %d bytes", errIdemKey, MaxIdempotencyKeyLen)
	}
	return key, nil
}

// charAt quotes the character that starts at v[i] for an error message: the
// whole UTF-8 sequence ('é', not its first byte), or the byte in hex when it
// starts no valid sequence.
func charAt(v string, i int) string {
	r, size := utf8.DecodeRuneInString(v[i:])
	if r == utf8.RuneError && size <= 1 {
		return fmt.Sprintf("byte %#02x", v[i])
	}
	return strconv.QuoteRune(r)
}

// validHeaderName reports whether name is a header field name (an RFC 9110
// token) that a request can carry.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == ':' || c == '/' || !isTokenChar(c) {
			return false
		}
	}
	return true
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// isTokenChar reports whether c may appear in a bare key: an RFC 9110
// tchar, ':' or '/'.
func isTokenChar(c byte) bool {
	if isAlpha(c) || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

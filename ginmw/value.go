package ginmw

import (
	"fmt"
	"math"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// MaxValueLen is the longest value, in bytes before escaping, that a field
// may contribute to a key. Longer values are refused with ErrUnsafeValue.
const MaxValueLen = 128

// valueProblem says why a value cannot become part of a key.
type valueProblem uint8

const (
	valueOK valueProblem = iota
	valueEmpty
	valueTooLong
	valueControl
	valueBrace
	valueBadUTF8
)

func (p valueProblem) reason() string {
	switch p {
	case valueEmpty:
		return "value is empty"
	case valueTooLong:
		return "value longer than " + strconv.Itoa(MaxValueLen) + " bytes"
	case valueControl:
		return "value contains a control character"
	case valueBrace:
		return `value contains "{" or "}"`
	case valueBadUTF8:
		return "value is not valid UTF-8"
	}
	return ""
}

// appendValue appends the request value v to the key dst, or reports why it
// must not be part of a key. A value is safe when it is 1 to MaxValueLen
// bytes of valid UTF-8 without control characters (Unicode category Cc: C0,
// DEL, C1) and without braces, which would let a client move the key to
// another Redis Cluster hash slot or forge a hash tag.
//
// When esc >= 0, the field is followed by another field, and esc is the
// first character of the literal text between them. The value is then
// escaped: '%' and esc are written as %XX (upper-case hex of each UTF-8
// byte). That keeps keys unambiguous: with order:<a>:<b>, the values
// a="1:2", b="3" and a="1", b="2:3" would otherwise both give "order:1:2:3".
// The last field needs no escaping (the key's end delimits it), so the
// common single-field key (sku:<id> → sku:42) is the value as sent.
func appendValue[T string | []byte](dst []byte, v T, esc rune) ([]byte, valueProblem) {
	if len(v) == 0 {
		return dst, valueEmpty
	}
	if len(v) > MaxValueLen {
		return dst, valueTooLong
	}
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			switch {
			case c < 0x20 || c == 0x7f:
				return dst, valueControl
			case c == '{' || c == '}':
				return dst, valueBrace
			case esc >= 0 && (c == '%' || rune(c) == esc):
				dst = appendPercent(dst, c)
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		end := min(i+utf8.UTFMax, len(v))
		// string(v[i:end]) of at most 4 bytes does not escape and is
		// not allocated on the heap.
		r, size := utf8.DecodeRuneInString(string(v[i:end]))
		if r == utf8.RuneError && size == 1 {
			return dst, valueBadUTF8
		}
		if unicode.IsControl(r) {
			return dst, valueControl
		}
		if r == esc {
			for k := i; k < i+size; k++ {
				dst = appendPercent(dst, v[k])
			}
		} else {
			dst = append(dst, v[i:i+size]...)
		}
		i += size
	}
	return dst, valueOK
}

func appendPercent(dst []byte, c byte) []byte {
	const hex = "0123456789ABCDEF"
	return append(dst, '%', hex[c>>4], hex[c&0xF])
}

// ctxValue renders a value stored on the gin context (a <ctx:...> field)
// into buf and returns the rendered bytes, or the string itself for string
// values. Supported: string, []byte, signed and unsigned integers (decimal),
// bool ("true"/"false"), finite floats (shortest decimal, no exponent:
// 42.0 → "42"), and any fmt.Stringer (its String result, e.g. a uuid.UUID
// or json.Number). A nil value counts as missing. Any other type, and NaN or
// an infinity, is ErrValueType: the middleware that set the value has a bug.
func ctxValue(v any, buf []byte) (s string, b []byte, isBytes bool, err error) {
	switch v := v.(type) {
	case string:
		return v, nil, false, nil
	case []byte:
		return "", v, true, nil
	case int:
		return "", strconv.AppendInt(buf, int64(v), 10), true, nil
	case int8:
		return "", strconv.AppendInt(buf, int64(v), 10), true, nil
	case int16:
		return "", strconv.AppendInt(buf, int64(v), 10), true, nil
	case int32:
		return "", strconv.AppendInt(buf, int64(v), 10), true, nil
	case int64:
		return "", strconv.AppendInt(buf, v, 10), true, nil
	case uint:
		return "", strconv.AppendUint(buf, uint64(v), 10), true, nil
	case uint8:
		return "", strconv.AppendUint(buf, uint64(v), 10), true, nil
	case uint16:
		return "", strconv.AppendUint(buf, uint64(v), 10), true, nil
	case uint32:
		return "", strconv.AppendUint(buf, uint64(v), 10), true, nil
	case uint64:
		return "", strconv.AppendUint(buf, v, 10), true, nil
	case bool:
		return strconv.FormatBool(v), nil, false, nil
	case float64:
		return appendFloat(buf, v, 64)
	case float32:
		return appendFloat(buf, float64(v), 32)
	case fmt.Stringer:
		return v.String(), nil, false, nil
	}
	return "", nil, false, fmt.Errorf("%w %T", ErrValueType, v)
}

func appendFloat(buf []byte, f float64, bits int) (string, []byte, bool, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", nil, false, fmt.Errorf("%w: %v has no key form", ErrValueType, f)
	}
	if f == 0 {
		f = 0 // -0 and 0 are the same key
	}
	return "", strconv.AppendFloat(buf, f, 'f', -1, bits), true, nil
}

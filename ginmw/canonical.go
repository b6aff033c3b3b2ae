package ginmw

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The canonical form of a JSON document is what a handler binding it with
// encoding/json sees, written one way: no whitespace, the members of every
// object sorted, every string written with its escapes decoded and invalid
// UTF-8 as U+FFFD (as encoding/json decodes it), numbers as written. Two
// documents with one canonical form bind alike, into a struct as into
// map[string]any; a document binds like its canonical form.
//
// Object members are matched to struct fields case-insensitively, so an
// object with two members whose names are equal under case folding
// ({"a":1,"A":2}) binds one way into a struct and another into a map, and
// differently again with its members swapped: such a document has no
// canonical form and is refused, as the key lookup refuses it.
//
// The canonical form is written in one pass over the body, after one pass
// that checks it and one that notes where each object and array ends, so it
// costs memory for that note (8 bytes per object or array) and for the
// members of the objects being written at one time, never a decoded copy of
// the document.

// canonBuffer is how much canonical text is collected before it is written.
const canonBuffer = 4 << 10

// CanonicalJSON writes the canonical form of the JSON document doc to w. It
// fails with an error wrapping ErrBadBody when doc is not exactly one JSON
// value or holds an object with two members whose names are equal under
// case folding; the error does not echo the document.
func CanonicalJSON(w io.Writer, doc []byte) error {
	cw, err := newCanonWriter(w, doc)
	if err != nil {
		return err
	}
	return cw.document(skipWS(doc, 0))
}

// CanonicalJSONFields writes, for the dotted paths given ("order.sku",
// "items.0"), a JSON array of the canonical forms of the values at those
// paths of doc, null where nothing is there. Members are found as a Template
// finds body fields and as encoding/json matches struct fields, by name
// under case folding; a path that names two members of one object is
// refused like a document CanonicalJSON refuses. Only the values at the
// paths are canonicalised.
func CanonicalJSONFields(w io.Writer, doc []byte, paths []string) error {
	if off, ok := checkJSON(doc); !ok {
		return fmt.Errorf("%w: not valid JSON (error at byte %d)", ErrBadBody, off)
	}
	if _, err := io.WriteString(w, "["); err != nil {
		return err
	}
	for i, p := range paths {
		if i > 0 {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		v, status, depth := jsonFind(doc, strings.Split(p, "."))
		switch status {
		case notFound:
			if _, err := io.WriteString(w, "null"); err != nil {
				return err
			}
			continue
		case ambiguous:
			return fmt.Errorf("%w: more than one member answers to segment %d of %q (names that differ only in case count as the same)", ErrBadBody, depth+1, p)
		}
		cw, err := newCanonWriter(w, doc[v.start:v.end])
		if err != nil {
			return err
		}
		if err := cw.document(0); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, "]")
	return err
}

// canonWriter writes the canonical form of one checked document.
type canonWriter struct {
	w   io.Writer
	doc []byte
	out []byte
	err error
	// ends holds, for the objects and arrays of doc in the order they
	// open, where each ends and the ordinal of the next one to open.
	ends []containerEnd
	// members is a stack of the members of the objects being written.
	members []member
}

type containerEnd struct{ end, next int32 }

// member is an object member: where its name and its value start, and the
// ordinal of its value when the value is an object or an array.
type member struct{ key, val, ord int32 }

func newCanonWriter(w io.Writer, doc []byte) (*canonWriter, error) {
	if len(doc) > math.MaxInt32 {
		return nil, fmt.Errorf("%w: over %d bytes", ErrBodyTooLarge, math.MaxInt32)
	}
	if off, ok := checkJSON(doc); !ok {
		return nil, fmt.Errorf("%w: not valid JSON (error at byte %d)", ErrBadBody, off)
	}
	cw := &canonWriter{w: w, doc: doc, out: make([]byte, 0, canonBuffer)}
	cw.noteEnds()
	return cw, nil
}

// noteEnds fills ends, in two scans of the document: one counts the objects
// and arrays, so that the note is allocated once at its size.
func (cw *canonWriter) noteEnds() {
	doc := cw.doc
	n := 0
	for i := 0; i < len(doc); i++ {
		switch doc[i] {
		case '"':
			i, _ = skipString(doc, i)
			i--
		case '{', '[':
			n++
		}
	}
	if n == 0 {
		return
	}
	cw.ends = make([]containerEnd, n)
	open := make([]int32, 0, 64)
	k := int32(0)
	for i := 0; i < len(doc); i++ {
		switch doc[i] {
		case '"':
			i, _ = skipString(doc, i)
			i--
		case '{', '[':
			open = append(open, k)
			k++
		case '}', ']':
			o := open[len(open)-1]
			open = open[:len(open)-1]
			cw.ends[o] = containerEnd{end: int32(i + 1), next: k}
		}
	}
}

// document writes the value at i, the document's top-level value, and
// flushes.
func (cw *canonWriter) document(i int) error {
	ord := int32(0)
	cw.value(i, ord)
	if cw.err == nil && len(cw.out) > 0 {
		_, cw.err = cw.w.Write(cw.out)
		cw.out = cw.out[:0]
	}
	return cw.err
}

func (cw *canonWriter) flush() {
	if len(cw.out) >= canonBuffer && cw.err == nil {
		_, cw.err = cw.w.Write(cw.out)
		cw.out = cw.out[:0]
	}
}

// value writes the value that starts at doc[i]; ord is its ordinal when it
// is an object or an array. It returns the ordinal of the next object or
// array after it.
func (cw *canonWriter) value(i int, ord int32) int32 {
	if cw.err != nil {
		return ord
	}
	doc := cw.doc
	switch doc[i] {
	case '{':
		return cw.object(i, ord)
	case '[':
		return cw.array(i, ord)
	case '"':
		end, _ := skipString(doc, i)
		cw.out = appendCanonicalString(cw.out, doc[i+1:end-1])
	default:
		v := valueAt(doc, i)
		cw.out = append(cw.out, doc[v.start:v.end]...)
	}
	cw.flush()
	return ord
}

func (cw *canonWriter) array(i int, ord int32) int32 {
	doc := cw.doc
	next := ord + 1
	cw.out = append(cw.out, '[')
	for j, n := skipWS(doc, i+1), 0; doc[j] != ']'; n++ {
		if n > 0 {
			cw.out = append(cw.out, ',')
		}
		end := 0
		if c := doc[j]; c == '{' || c == '[' {
			end = int(cw.ends[next].end)
			next = cw.value(j, next)
		} else {
			end = valueAt(doc, j).end
			cw.value(j, next)
		}
		if cw.err != nil {
			return next
		}
		if j = skipWS(doc, end); doc[j] == ',' {
			j = skipWS(doc, j+1)
		}
	}
	cw.out = append(cw.out, ']')
	cw.flush()
	return cw.ends[ord].next
}

func (cw *canonWriter) object(i int, ord int32) int32 {
	doc := cw.doc
	base := len(cw.members)
	next := ord + 1
	for j := skipWS(doc, i+1); doc[j] != '}'; {
		key := j
		keyEnd, _ := skipString(doc, j)
		j = skipWS(doc, skipWS(doc, keyEnd)+1) // past ':'
		m := member{key: int32(key), val: int32(j), ord: -1}
		end := 0
		if c := doc[j]; c == '{' || c == '[' {
			m.ord = next
			end = int(cw.ends[next].end)
			next = cw.ends[next].next
		} else {
			end = valueAt(doc, j).end
		}
		cw.push(m)
		if j = skipWS(doc, end); doc[j] == ',' {
			j = skipWS(doc, j+1)
		}
	}
	ms := cw.members[base:]
	slices.SortFunc(ms, func(a, b member) int { return cw.compareKeys(a.key, b.key) })
	for k := 1; k < len(ms); k++ {
		if cw.compareKeys(ms[k-1].key, ms[k].key) == 0 {
			cw.err = fmt.Errorf("%w: an object has two members whose names differ only in case (at bytes %d and %d); encoding/json would bind them to one field",
				ErrBadBody, min(ms[k-1].key, ms[k].key), max(ms[k-1].key, ms[k].key))
			cw.members = cw.members[:base]
			return next
		}
	}
	cw.out = append(cw.out, '{')
	for k := base; k < len(cw.members); k++ {
		m := cw.members[k] // the stack may grow below: index, do not range
		if k > base {
			cw.out = append(cw.out, ',')
		}
		keyEnd, _ := skipString(doc, int(m.key))
		cw.out = appendCanonicalString(cw.out, doc[m.key+1:keyEnd-1])
		cw.out = append(cw.out, ':')
		cw.value(int(m.val), m.ord)
		if cw.err != nil {
			break
		}
	}
	cw.members = cw.members[:base]
	cw.out = append(cw.out, '}')
	cw.flush()
	return cw.ends[ord].next
}

// push adds m to the member stack, doubling it when full: append's gentler
// growth of large slices would allocate several times the final size.
func (cw *canonWriter) push(m member) {
	if len(cw.members) == cap(cw.members) {
		grown := make([]member, len(cw.members), max(16, 2*cap(cw.members)))
		copy(grown, cw.members)
		cw.members = grown
	}
	cw.members = append(cw.members, m)
}

// compareKeys orders the names of two members (strings starting at doc[a]
// and doc[b]) by their case-folded, unescaped text, the form in which
// encoding/json matches a name to a struct field: 0 means they bind to one
// field.
func (cw *canonWriter) compareKeys(a, b int32) int {
	doc := cw.doc
	ea, _ := skipString(doc, int(a))
	eb, _ := skipString(doc, int(b))
	ra, rb := doc[a+1:ea-1], doc[b+1:eb-1]
	for {
		x, nx := decodeJSONRune(ra)
		y, ny := decodeJSONRune(rb)
		switch {
		case nx == 0 && ny == 0:
			return 0
		case nx == 0:
			return -1
		case ny == 0:
			return 1
		}
		if fx, fy := foldRune(x), foldRune(y); fx != fy {
			if fx < fy {
				return -1
			}
			return 1
		}
		ra, rb = ra[nx:], rb[ny:]
	}
}

// foldRune maps r to one representative of its case-folding class, as
// encoding/json folds names: ASCII letters to upper case, any other rune to
// the smallest rune of its class.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// decodeJSONRune returns the first character of the raw content of a
// checked JSON string, as encoding/json decodes it (escapes decoded, a lone
// surrogate or a byte of invalid UTF-8 as U+FFFD), and how many bytes it
// took; 0 at the end.
func decodeJSONRune(raw []byte) (rune, int) {
	if len(raw) == 0 {
		return 0, 0
	}
	c := raw[0]
	if c < utf8.RuneSelf && c != '\\' {
		return rune(c), 1
	}
	if c != '\\' {
		return utf8.DecodeRune(raw) // RuneError, 1 for invalid UTF-8
	}
	switch raw[1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r := hex4(raw[2:6])
		if !utf16.IsSurrogate(r) {
			return r, 6
		}
		if len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
			if dec := utf16.DecodeRune(r, hex4(raw[8:12])); dec != utf8.RuneError {
				return dec, 12
			}
		}
		return utf8.RuneError, 6
	}
	return rune(raw[1]), 2 // '"', '\\', '/'
}

// appendCanonicalString appends the canonical form of the string whose raw
// content (without quotes) is raw: quoted, with only '"', '\\' and control
// characters escaped, so that two strings that decode alike are written
// alike and two that decode differently are not.
func appendCanonicalString(dst, raw []byte) []byte {
	dst = append(dst, '"')
	plain := 0 // raw[plain:i] is text to copy as it is
	i := 0
	for i < len(raw) {
		c := raw[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			if r, n := utf8.DecodeRune(raw[i:]); r != utf8.RuneError || n != 1 {
				i += n
				continue
			}
		}
		dst = append(dst, raw[plain:i]...)
		r, n := decodeJSONRune(raw[i:])
		i += n
		plain = i
		switch {
		case r == '"':
			dst = append(dst, '\\', '"')
		case r == '\\':
			dst = append(dst, '\\', '\\')
		case r < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', "0123456789abcdef"[r>>4], "0123456789abcdef"[r&0xf])
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	dst = append(dst, raw[plain:]...)
	return append(dst, '"')
}

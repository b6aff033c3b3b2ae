package ginmw

import (
	"fmt"
	"net/textproto"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Source says where a template field takes its value from.
type Source uint8

// The sources of a field, written <name> for SourceAny and <source:name>
// for the others.
const (
	// SourceAny (<id>) takes the first of: the route's path parameter, the
	// query parameter, the top-level field of the form or JSON body. (A
	// guard.Lock template applies only to routes that have the path
	// parameter; see guard.Lock.)
	SourceAny Source = iota
	// SourcePath (<path:id>) takes the route's path parameter (c.Param).
	SourcePath
	// SourceQuery (<query:id>) takes the first query parameter of that
	// name, as c.Query does.
	SourceQuery
	// SourceHeader (<header:X-User-ID>) takes the first value of the
	// request header; the name is case-insensitive.
	SourceHeader
	// SourceBody (<body:order.sku>) takes a field of the body. For a JSON
	// body the name is a dotted path (a segment that is a decimal number
	// indexes an array); for a form body it is a form field name, the same
	// c.PostForm sees.
	SourceBody
	// SourceCtx (<ctx:user_id>) takes a value an earlier middleware stored
	// with c.Set.
	SourceCtx
)

var sourceNames = [...]string{
	SourceAny:    "",
	SourcePath:   "path",
	SourceQuery:  "query",
	SourceHeader: "header",
	SourceBody:   "body",
	SourceCtx:    "ctx",
}

// String returns the source as written in a template ("path", "query",
// "header", "body", "ctx"), or "" for SourceAny.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// Field is one placeholder of a template.
type Field struct {
	Source Source // where the value is taken from
	// Name as it is looked up: a header name in canonical form
	// (X-User-Id), a body path with its dots (order.sku).
	Name string
}

// String returns the field in template notation: <id>, <body:order.sku>.
func (f Field) String() string {
	if f.Source == SourceAny {
		return "<" + f.Name + ">"
	}
	return "<" + f.Source.String() + ":" + f.Name + ">"
}

// Template is a parsed key template: literal text with fields that are
// filled from a request. It is immutable and safe for concurrent use.
//
// Literal text may contain any printable character, including the braces of
// a Redis Cluster hash tag, except '<' and '>'. Fields are <name> or
// <source:name>, where source is one of path, query, header, body, ctx and
// the name consists of ASCII letters, digits, '_', '-' and, with an
// explicit source, '.'. Two fields must be separated by literal text.
type Template struct {
	text   string
	parts  []part
	fields []Field
	body   bool
	litLen int
}

// part is literal text followed by at most one field.
type part struct {
	lit   string
	field int      // index into Template.fields; -1 for trailing literal text
	path  []string // SourceBody: the dotted path split into segments; SourceAny: the name
	// esc is the character a value of this field must not contain
	// unescaped, because it starts the literal text that separates this
	// field from the next one; -1 for the last field (see escape in
	// value.go).
	esc rune
}

// ParseTemplate parses a key template. The error, a *TemplateError matching
// ErrBadTemplate, shows the template and the 1-based column of the problem.
func ParseTemplate(text string) (*Template, error) {
	p := parser{text: text}
	t, err := p.parse()
	if err != nil {
		return nil, err
	}
	return t, nil
}

// MustParseTemplate is ParseTemplate for templates fixed at registration:
// it panics with the *TemplateError on a malformed template, so the mistake
// stops the service at boot instead of under traffic.
func MustParseTemplate(text string) *Template {
	t, err := ParseTemplate(text)
	if err != nil {
		panic(err)
	}
	return t
}

// String returns the template in canonical form: the literal text as
// written and the fields as Field.String writes them (header names
// canonicalised). Parsing it again gives an equal template.
func (t *Template) String() string { return t.text }

// Fields returns the template's fields in order of appearance. The slice is
// a copy.
func (t *Template) Fields() []Field {
	return append([]Field(nil), t.fields...)
}

// NeedsBody reports whether resolving the template may read the request
// body: true when a field has SourceBody or SourceAny. A template that does
// not need the body never reads it.
func (t *Template) NeedsBody() bool { return t.body }

// CheckRoute reports a <path:name> field whose parameter the gin route
// does not have: route is the path as registered ("/api/seckill/:sku",
// c.FullPath()), whose ":name" and "*name" segments are its parameters.
// Such a template would answer every request on the route with 400, so
// a policy that pairs them is refused at load time. <name> fields without
// a source are not checked: they may come from the query or the body. The
// error matches ErrBadTemplate.
func (t *Template) CheckRoute(route string) error {
	for _, f := range t.fields {
		if f.Source == SourcePath && !routeHasParam(route, f.Name) {
			return fmt.Errorf("%w: template %q: route %q has no path parameter %q", ErrBadTemplate, t.text, route, f.Name)
		}
	}
	return nil
}

// RouteHasParam reports whether the gin route (the path as registered,
// "/api/seckill/:sku") has the path parameter name: a ":name" or "*name"
// segment.
func RouteHasParam(route, name string) bool { return routeHasParam(route, name) }

func routeHasParam(route, name string) bool {
	for seg := range strings.SplitSeq(route, "/") {
		if len(seg) > 1 && (seg[0] == ':' || seg[0] == '*') && seg[1:] == name {
			return true
		}
	}
	return false
}

type parser struct {
	text string
}

// fail returns a *TemplateError at byte offset off.
func (p *parser) fail(off int, reason string) *TemplateError {
	if off > len(p.text) {
		off = len(p.text)
	}
	return &TemplateError{
		Template: p.text,
		Column:   utf8.RuneCountInString(p.text[:off]) + 1,
		Reason:   reason,
	}
}

func (p *parser) parse() (*Template, error) {
	text := p.text
	if text == "" {
		return nil, p.fail(0, "empty template")
	}
	t := &Template{}
	var canon strings.Builder
	canon.Grow(len(text))
	litStart := 0
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '<':
			lit := text[litStart:i]
			if lit == "" && len(t.fields) > 0 {
				return nil, p.fail(i, "field must be separated from the previous field by literal text")
			}
			end, err := p.fieldEnd(i)
			if err != nil {
				return nil, err
			}
			f, path, err := p.field(i+1, end)
			if err != nil {
				return nil, err
			}
			t.parts = append(t.parts, part{lit: lit, field: len(t.fields), path: path, esc: -1})
			t.fields = append(t.fields, f)
			t.litLen += len(lit)
			if f.Source == SourceAny || f.Source == SourceBody {
				t.body = true
			}
			canon.WriteString(lit)
			canon.WriteString(f.String())
			i = end + 1
			litStart = i
		case c == '>':
			return nil, p.fail(i, `">" without "<"`)
		case c < utf8.RuneSelf:
			if c < 0x20 || c == 0x7f {
				return nil, p.fail(i, "control character "+runeName(rune(c))+" in literal text")
			}
			i++
		default:
			r, size := utf8.DecodeRuneInString(text[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, p.fail(i, "invalid UTF-8 in literal text")
			}
			if unicode.IsControl(r) {
				return nil, p.fail(i, "control character "+runeName(r)+" in literal text")
			}
			i += size
		}
	}
	tail := text[litStart:]
	t.parts = append(t.parts, part{lit: tail, field: -1, esc: -1})
	t.litLen += len(tail)
	canon.WriteString(tail)
	t.text = canon.String()
	// Every field but the last is followed by non-empty literal text (the
	// separation rule above); its first character must not appear
	// unescaped in the field's value, so that keys stay unambiguous.
	for i := 0; i+1 < len(t.parts) && t.parts[i].field >= 0; i++ {
		if t.parts[i+1].field >= 0 {
			r, _ := utf8.DecodeRuneInString(t.parts[i+1].lit)
			t.parts[i].esc = r
		}
	}
	return t, nil
}

// fieldEnd returns the offset of the '>' closing the field opened at open.
func (p *parser) fieldEnd(open int) (int, error) {
	for j := open + 1; j < len(p.text); j++ {
		switch p.text[j] {
		case '>':
			return j, nil
		case '<':
			return 0, p.fail(open, `unclosed "<"`)
		}
	}
	return 0, p.fail(open, `unclosed "<"`)
}

// field parses the field text between offsets start and end (the '>').
func (p *parser) field(start, end int) (Field, []string, error) {
	body := p.text[start:end]
	if body == "" {
		return Field{}, nil, p.fail(start, "empty field name")
	}
	src := SourceAny
	nameStart := start
	if colon := strings.IndexByte(body, ':'); colon >= 0 {
		name := body[:colon]
		if name == "" {
			return Field{}, nil, p.fail(start, "empty source before \":\"")
		}
		var ok bool
		if src, ok = sourceByName(name); !ok {
			if err := p.checkName(start, start+colon, false); err != nil {
				return Field{}, nil, err
			}
			return Field{}, nil, p.fail(start, "unknown source \""+name+"\" (want path, query, header, body or ctx)")
		}
		nameStart = start + colon + 1
	}
	name := p.text[nameStart:end]
	if name == "" {
		return Field{}, nil, p.fail(nameStart, "empty field name")
	}
	if err := p.checkName(nameStart, end, src != SourceAny); err != nil {
		return Field{}, nil, err
	}
	var path []string
	switch src {
	case SourceAny:
		path = []string{name}
	case SourceHeader:
		name = textproto.CanonicalMIMEHeaderKey(name)
	case SourceBody:
		for off := nameStart; ; {
			dot := strings.IndexByte(p.text[off:end], '.')
			seg := p.text[off:end]
			if dot >= 0 {
				seg = p.text[off : off+dot]
			}
			if seg == "" {
				return Field{}, nil, p.fail(off, "empty segment in body path")
			}
			path = append(path, seg)
			if dot < 0 {
				break
			}
			off += dot + 1
		}
	}
	return Field{Source: src, Name: name}, path, nil
}

// checkName reports the first character of text[start:end] that a field
// name may not contain.
func (p *parser) checkName(start, end int, dotOK bool) error {
	for j := start; j < end; {
		c := p.text[j]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
			j++
			continue
		case c == '.':
			if dotOK {
				j++
				continue
			}
			return p.fail(j, `"." in a field without a source; write <body:a.b>, <query:a.b>, ...`)
		case c == ':':
			return p.fail(j, `second ":" in field`)
		}
		r, size := utf8.DecodeRuneInString(p.text[j:end])
		if r == utf8.RuneError && size <= 1 {
			return p.fail(j, "invalid UTF-8 in field name")
		}
		return p.fail(j, "invalid character "+runeName(r)+" in field name (want letters, digits, _ - .)")
	}
	return nil
}

func sourceByName(name string) (Source, bool) {
	for s, n := range sourceNames {
		if n != "" && n == name {
			return Source(s), true
		}
	}
	return 0, false
}

// runeName writes r for an error message: quoted when printable, as U+XXXX
// otherwise.
func runeName(r rune) string {
	if unicode.IsPrint(r) {
		return strconv.Quote(string(r))
	}
	return fmt.Sprintf("%U", r)
}

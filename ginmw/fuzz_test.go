package ginmw

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// safeOracle is the value rule written the obvious way, to check the fast
// one against.
func safeOracle(v string) bool {
	if len(v) == 0 || len(v) > MaxValueLen || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if unicode.Is(unicode.Cc, r) || r == '{' || r == '}' {
			return false
		}
	}
	return true
}

// testContext returns a gin context for req, as an engine would hand it
// to a handler.
func testContext(req *http.Request) *gin.Context {
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = req
	return c
}

func FuzzParseTemplate(f *testing.F) {
	for _, seed := range []string{
		"sku:<id>", "sku:<path:id>", "<query:a.b>", "u:<header:x-user-id>", "o:<body:order.items.0.sku>",
		"order:<ctx:user_id>:<body:order_no>", "{user:<ctx:user_id>}:order", "库存:<path:sku>", "global",
		"", "sku:<id", "<>", "<:x>", "<foo:x>", "<a b>", "a>b", "<a><b>", "<a.b>", "<body:a..b>", "<body:a:b>",
		"a\nb", "a\x7fb", "a\u0085b", "a\xffb", "<ctx:\xff>", "<a<b>", "{}<{}:x>",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		tpl, err := ParseTemplate(text)
		if err != nil {
			var te *TemplateError
			if !errors.As(err, &te) || !errors.Is(err, ErrBadTemplate) {
				t.Fatalf("ParseTemplate(%q) error %T %v is not a *TemplateError", text, err, err)
			}
			if te.Template != text || te.Column < 1 || te.Column > utf8.RuneCountInString(text)+1 || te.Reason == "" {
				t.Fatalf("ParseTemplate(%q): %+v has a column outside the template", text, te)
			}
			if !strings.Contains(err.Error(), strconv.Quote(text)+" column "+strconv.Itoa(te.Column)+": ") {
				t.Fatalf("ParseTemplate(%q) message %q does not show the template and column", text, err)
			}
			return
		}
		again, err := ParseTemplate(tpl.String())
		if err != nil {
			t.Fatalf("ParseTemplate(%q).String() = %q does not parse: %v", text, tpl.String(), err)
		}
		if again.String() != tpl.String() || !slices.Equal(again.Fields(), tpl.Fields()) ||
			again.NeedsBody() != tpl.NeedsBody() || again.litLen != tpl.litLen || len(again.parts) != len(tpl.parts) {
			t.Fatalf("round trip of %q: %q %v, then %q %v", text, tpl.String(), tpl.Fields(), again.String(), again.Fields())
		}
		for i := range tpl.parts {
			a, b := tpl.parts[i], again.parts[i]
			if a.lit != b.lit || a.field != b.field || a.esc != b.esc || !slices.Equal(a.path, b.path) {
				t.Fatalf("round trip of %q: part %d %+v became %+v", text, i, a, b)
			}
		}
		// Only fields and their header canonicalisation may differ from
		// the input; the literal text is kept byte for byte.
		var lits strings.Builder
		for _, p := range tpl.parts {
			lits.WriteString(p.lit)
		}
		if lits.Len() != tpl.litLen || strings.ContainsAny(lits.String(), "<>") || !utf8.ValidString(lits.String()) {
			t.Fatalf("ParseTemplate(%q): literal text %q", text, lits.String())
		}
	})
}

// valueInRequest puts v into a request the way the source numbered where
// takes it and returns the context to resolve against and the field text.
func valueInRequest(v string, where uint8) (*gin.Context, string) {
	switch where % 5 {
	case 0:
		c := testContext(httptest.NewRequest(http.MethodGet, "/", nil))
		c.Set("v", v)
		return c, "<ctx:v>"
	case 1:
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header["X-V"] = []string{v}
		return testContext(req), "<header:X-V>"
	case 2:
		return testContext(httptest.NewRequest(http.MethodGet, "/?v="+urlEscape(v), nil)), "<query:v>"
	case 3:
		return testContext(jsonPost("/", `{"w":{"v":"`+jsonRaw(v)+`"}}`)), "<body:w.v>"
	default:
		return testContext(formPost(http.MethodPost, "/", "v="+urlEscape(v))), "<body:v>"
	}
}

func FuzzValueSafety(f *testing.F) {
	for _, uv := range unsafeValues {
		f.Add(uv.value, uint8(0), true)
	}
	for i, v := range []string{"sku-42", "a:b", "50%", "库存", "😀", strings.Repeat("x", 128), "", "{", "\u2028", "\u00a0", "%3A"} {
		f.Add(v, uint8(i), i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, v string, where uint8, followed bool) {
		c, field := valueInRequest(v, where)
		c.Set("next", "n")
		text := "{t:" + field + "}"
		if followed { // the field is followed by another: its separator ':' gets escaped
			text = "{t:" + field + ":<ctx:next>}"
		}
		tpl := MustParseTemplate(text)
		key, err := tpl.Resolve(c, 0)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !(errors.Is(err, ErrUnsafeValue) || errors.Is(err, ErrMissingField)) {
				t.Fatalf("%s with %q: unexpected error %v", text, v, err)
			}
			if safeOracle(v) {
				t.Fatalf("%s with safe %q: %v", text, v, err)
			}
			if key != "" {
				t.Fatalf("%s with %q: key %q returned with an error", text, v, key)
			}
			return
		}
		if !safeOracle(v) {
			t.Fatalf("%s with unsafe %q gave key %q", text, v, key)
		}
		if !utf8.ValidString(key) {
			t.Fatalf("key %q is not valid UTF-8", key)
		}
		for _, r := range key {
			if unicode.Is(unicode.Cc, r) {
				t.Fatalf("key %q has a control character", key)
			}
		}
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || key[0] != '{' || key[len(key)-1] != '}' {
			t.Fatalf("key %q has braces that are not the template's", key)
		}
		if max := tpl.litLen + 3*MaxValueLen*len(tpl.fields); len(key) > max {
			t.Fatalf("key %q is %d bytes, over %d", key, len(key), max)
		}
		want := "{t:" + v + "}"
		if followed {
			want = "{t:" + strings.NewReplacer("%", "%25", ":", "%3A").Replace(v) + ":n}"
		}
		if key != want {
			t.Fatalf("%s with %q: key %q, want %q", text, v, key, want)
		}
	})
}

func FuzzKeyUnambiguous(f *testing.F) {
	f.Add("1:2", "3", "1", "2:3", ":")
	f.Add("50%", "x", "50%25", "x", ":")
	f.Add("a·b", "c", "a", "b·c", "·")
	f.Add("a", "b", "a", "b", "-")
	f.Fuzz(func(t *testing.T, a1, b1, a2, b2, sep string) {
		tpl, err := ParseTemplate("o:<ctx:a>" + sep + "<ctx:b>")
		if err != nil {
			return
		}
		resolveAB := func(a, b string) (string, error) {
			c := testContext(httptest.NewRequest(http.MethodGet, "/", nil))
			c.Set("a", a)
			c.Set("b", b)
			return tpl.Resolve(c, 0)
		}
		k1, err1 := resolveAB(a1, b1)
		k2, err2 := resolveAB(a2, b2)
		if err1 != nil || err2 != nil {
			return
		}
		if (a1 != a2 || b1 != b2) && k1 == k2 {
			t.Fatalf("%s: (%q, %q) and (%q, %q) both give %q", tpl, a1, b1, a2, b2, k1)
		}
		if a1 == a2 && b1 == b2 && k1 != k2 {
			t.Fatalf("%s: (%q, %q) gives %q and %q", tpl, a1, b1, k1, k2)
		}
	})
}

// referenceMember returns the values of the top-level members of the JSON
// object body whose key folds to name, decoded by encoding/json.
func referenceMember(body []byte, name string) ([]any, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var vals []any
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if bytes.EqualFold([]byte(tok.(string)), []byte(name)) {
			vals = append(vals, v)
		}
	}
	return vals, true
}

func FuzzJSONBody(f *testing.F) {
	for _, seed := range []string{
		`{"id":"a"}`, `{"ID":1.50}`, `{"id":"\u0041\ud83d\ude00"}`, `{"id":"\ud800"}`, `{"id":true}`, `{"id":null}`,
		`{"id":{"x":1}}`, `{"id":"a","Id":"b"}`, `[1]`, `{"id":`, `{"id":"a"} x`, ` {"i\u0064" : -0 } `,
		`{"id":1e400}`, `{"id":"\u0000"}`, "{\"id\":\"\xff\"}", `{"a":[{"b":[]}],"id":"x"}`, `{"id":01}`,
	} {
		f.Add([]byte(seed), "id")
	}
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		_, ok := checkJSON(body)
		if ok != json.Valid(body) {
			t.Fatalf("checkJSON(%q) = %v, json.Valid = %v", body, ok, !ok)
		}
		tpl, err := ParseTemplate("k:<body:" + name + ">")
		if err != nil || strings.Contains(name, ".") {
			return
		}
		key, err := tpl.Resolve(testContext(jsonPost("/", string(body))), 0)
		if !ok {
			if len(bytes.TrimSpace(body)) > 0 && !errors.Is(err, ErrBadBody) {
				t.Fatalf("invalid body %q: Resolve = %q, %v", body, key, err)
			}
			return
		}
		vals, isObject := referenceMember(body, name)
		switch {
		case len(bytes.TrimLeft(body, " \t\r\n")) == 0:
			return
		case !isObject:
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("non-object %q: Resolve = %q, %v", body, key, err)
			}
			return
		case len(vals) == 0 || len(vals) == 1 && vals[0] == nil:
			if !errors.Is(err, ErrMissingField) {
				t.Fatalf("%q without %s: Resolve = %q, %v", body, name, key, err)
			}
			return
		case len(vals) > 1:
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("%q with %s twice: Resolve = %q, %v", body, name, key, err)
			}
			return
		}
		switch v := vals[0].(type) {
		case string:
			if !utf8.Valid(body) && strings.ContainsRune(v, utf8.RuneError) && errors.Is(err, ErrUnsafeValue) {
				return // raw invalid UTF-8, which encoding/json turns into U+FFFD, is refused
			}
			if !safeOracle(v) {
				if err == nil {
					t.Fatalf("%q: unsafe %q gave key %q", body, v, key)
				}
				return
			}
			if err != nil || key != "k:"+v {
				t.Fatalf("%q: Resolve = %q, %v; encoding/json sees %q", body, key, err, v)
			}
		case bool:
			if err != nil || key != "k:"+strconv.FormatBool(v) {
				t.Fatalf("%q: Resolve = %q, %v; encoding/json sees %v", body, key, err, v)
			}
		case json.Number:
			want, ferr := strconv.ParseFloat(string(v), 64)
			if ferr != nil {
				if err == nil {
					t.Fatalf("%q: out-of-range number gave key %q", body, key)
				}
				return
			}
			if err != nil {
				if !errors.Is(err, ErrUnsafeValue) { // over 128 digits
					t.Fatalf("%q: Resolve = %v", body, err)
				}
				return
			}
			got, _ := strconv.ParseFloat(strings.TrimPrefix(key, "k:"), 64)
			if got != want {
				t.Fatalf("%q: key %q, encoding/json sees %v", body, key, v)
			}
		default: // object or array
			if !errors.Is(err, ErrUnsafeValue) {
				t.Fatalf("%q: Resolve = %q, %v for %T", body, key, err, v)
			}
		}
	})
}

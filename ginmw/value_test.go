package ginmw

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// unsafeValues are values that must never become part of a key, by kind.
var unsafeValues = []struct {
	kind, value, reason string
}{
	{"NUL", "a\x00b", "value contains a control character"},
	{"newline", "a\nb", "value contains a control character"},
	{"carriage return", "a\rb", "value contains a control character"},
	{"tab", "a\tb", "value contains a control character"},
	{"escape", "a\x1bb", "value contains a control character"},
	{"DEL", "a\x7fb", "value contains a control character"},
	{"C1 NEL", "a\u0085b", "value contains a control character"},
	{"open brace", "{a", `value contains "{" or "}"`},
	{"close brace", "a}", `value contains "{" or "}"`},
	{"hash tag", "{x}", `value contains "{" or "}"`},
	{"invalid UTF-8", "a\xffb", "value is not valid UTF-8"},
	{"truncated UTF-8", "a\xe5\xba", "value is not valid UTF-8"},
	{"surrogate in UTF-8", "a\xed\xa0\x80", "value is not valid UTF-8"},
	{"129 bytes", strings.Repeat("x", 129), "value longer than 128 bytes"},
}

// valueSources puts a value into a request in each way a field can take it;
// each returns the template, the route, the request and the middleware.
var valueSources = map[string]func(v string) (string, string, *http.Request, []gin.HandlerFunc){
	"header": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header["X-V"] = []string{v} // set directly: the client side would refuse some
		return "k:<header:X-V>", "/", req, nil
	},
	"query": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		req := httptest.NewRequest(http.MethodGet, "/?v="+urlEscape(v), nil)
		return "k:<query:v>", "/", req, nil
	},
	"path": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		req := httptest.NewRequest(http.MethodGet, "/x", nil)
		req.URL.Path = "/p/" + v // gin matches on the decoded path
		return "k:<path:v>", "/p/:v", req, nil
	},
	"ctx": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		return "k:<ctx:v>", "/", httptest.NewRequest(http.MethodGet, "/", nil), []gin.HandlerFunc{setCtx("v", v)}
	},
	"json raw": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		return "k:<body:v>", "/", jsonPost("/", `{"v":"`+jsonRaw(v)+`"}`), nil
	},
	"json escaped": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		return "k:<body:v>", "/", jsonPost("/", `{"v":"`+jsonEscapeAll(v)+`"}`), nil
	},
	"form": func(v string) (string, string, *http.Request, []gin.HandlerFunc) {
		return "k:<body:v>", "/", formPost(http.MethodPost, "/", "v="+urlEscape(v)), nil
	},
}

// urlEscape percent-encodes every byte, so any byte string survives.
func urlEscape(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		b.WriteString("%" + strconv.FormatUint(uint64(v[i])>>4, 16) + strconv.FormatUint(uint64(v[i])&0xF, 16))
	}
	return b.String()
}

// jsonRaw writes v into a JSON string with only the escapes JSON requires,
// leaving invalid UTF-8 as it is.
func jsonRaw(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"' || c == '\\':
			b.WriteString(`\` + string(c))
		case c < 0x20:
			b.WriteString(`\u00` + strconv.FormatUint(uint64(c)>>4, 16) + strconv.FormatUint(uint64(c)&0xF, 16))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// jsonEscapeAll writes v into a JSON string with every character as a
// \u escape (invalid UTF-8 becomes U+FFFD, as encoding/json would).
func jsonEscapeAll(v string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(v, "\uFFFD") {
		q, _ := json.Marshal(string(r))
		if r < 0x10000 {
			b.WriteString(`\u` + leftPad(strconv.FormatInt(int64(r), 16)))
		} else {
			b.Write(q[1 : len(q)-1])
		}
	}
	return b.String()
}

func leftPad(h string) string { return strings.Repeat("0", 4-len(h)) + h }

func TestResolve_UnsafeValuesAreRefusedFromEverySource(t *testing.T) {
	for name, source := range valueSources {
		for _, uv := range unsafeValues {
			if name == "json escaped" && strings.Contains(uv.kind, "UTF-8") {
				continue // an escape cannot express invalid UTF-8
			}
			if name == "path" && (uv.value == "a\x00b" || strings.ContainsAny(uv.value, "/")) {
				continue
			}
			tmpl, route, req, mw := source(uv.value)
			o := resolveOn(t, tmpl, route, req, mw, nil)
			fe, ok := o.err.(*FieldError)
			if !ok || fe.Err != ErrUnsafeValue || fe.Reason != uv.reason {
				t.Errorf("%s %s: Resolve = %q, %v; want ErrUnsafeValue %q", name, uv.kind, o.key, o.err, uv.reason)
				continue
			}
			if Status(o.err) != http.StatusBadRequest {
				t.Errorf("%s %s: Status = %d, want 400", name, uv.kind, Status(o.err))
			}
			if strings.Contains(o.err.Error(), uv.value) {
				t.Errorf("%s %s: error %q quotes the value", name, uv.kind, o.err)
			}
		}
	}
}

func TestResolve_ValueOf128BytesPassesAnd129Fails(t *testing.T) {
	ascii128 := strings.Repeat("x", 128)
	multi128 := strings.Repeat("库", 42) + "xx" // 42*3+2 bytes
	if len(multi128) != 128 {
		t.Fatal(len(multi128))
	}
	for name, source := range valueSources {
		for _, v := range []string{ascii128, multi128} {
			tmpl, route, req, mw := source(v)
			o := resolveOn(t, tmpl, route, req, mw, nil)
			if o.err != nil || o.key != "k:"+v {
				t.Errorf("%s, %d-byte value: Resolve = %q, %v", name, len(v), o.key, o.err)
			}
		}
		for _, v := range []string{ascii128 + "y", multi128 + "y", strings.Repeat("库", 43)} {
			tmpl, route, req, mw := source(v)
			o := resolveOn(t, tmpl, route, req, mw, nil)
			wantFieldErr(t, o, tmpl[2:], ErrUnsafeValue)
		}
	}
}

func TestResolve_EmptyValueIsMissingFromEverySource(t *testing.T) {
	for name, source := range valueSources {
		if name == "path" {
			continue // gin does not match an empty path segment
		}
		tmpl, route, req, mw := source("")
		o := resolveOn(t, tmpl, route, req, mw, nil)
		if fe, ok := o.err.(*FieldError); !ok || fe.Err != ErrMissingField || fe.Reason != "value is empty" {
			t.Errorf("%s: Resolve = %q, %v; want ErrMissingField", name, o.key, o.err)
		}
	}
}

func TestResolve_PrintableUnicodeAndPunctuationPassUnchanged(t *testing.T) {
	v := `Ünïcödé 库存 😀 !"#$&'()*+,-./:;<=>?@[\]^_|~ `
	for name, source := range valueSources {
		if name == "path" {
			continue // '?' and '#' do not survive in a path
		}
		tmpl, route, req, mw := source(v)
		o := resolveOn(t, tmpl, route, req, mw, nil)
		if o.err != nil || o.key != "k:"+v {
			t.Errorf("%s: Resolve = %q, %v; want %q", name, o.key, o.err, "k:"+v)
		}
	}
}

func TestResolve_LongEscapedJSONStringIsTooLong(t *testing.T) {
	v := strings.Repeat(`\u0078`, 6*MaxValueLen/6+1) // 129 characters, each 6 bytes escaped
	o := resolve(t, "k:<body:v>", "/", jsonPost("/", `{"v":"`+v+`"}`))
	wantFieldErr(t, o, "<body:v>", ErrUnsafeValue)
	v = strings.Repeat(`\u0078`, MaxValueLen)
	wantKey(t, resolve(t, "k:<body:v>", "/", jsonPost("/", `{"v":"`+v+`"}`)), "k:"+strings.Repeat("x", 128))
}

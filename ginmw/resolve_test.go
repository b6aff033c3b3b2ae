package ginmw

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// jsonPost returns a POST request with a JSON body.
func jsonPost(target, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// formPost returns a request with an urlencoded form body.
func formPost(method, target, body string) *http.Request {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

// wantKey fails the test unless o is a key equal to want.
func wantKey(t *testing.T, o outcome, want string) {
	t.Helper()
	if o.err != nil || o.key != want {
		t.Fatalf("Resolve = %q, %v; want %q", o.key, o.err, want)
	}
}

// wantFieldErr fails the test unless o is a *FieldError for field matching
// sentinel.
func wantFieldErr(t *testing.T, o outcome, field string, sentinel error) *FieldError {
	t.Helper()
	var fe *FieldError
	if !errors.As(o.err, &fe) || !errors.Is(o.err, sentinel) {
		t.Fatalf("Resolve = %q, %v; want a *FieldError matching %v", o.key, o.err, sentinel)
	}
	if fe.Field.String() != field {
		t.Fatalf("FieldError.Field = %s, want %s", fe.Field, field)
	}
	return fe
}

func TestResolve_PathParameter(t *testing.T) {
	o := resolve(t, "sku:<path:id>", "/sku/:id", httptest.NewRequest(http.MethodGet, "/sku/42?id=7", nil))
	wantKey(t, o, "sku:42")
}

func TestResolve_PathParameterMissingFromRoute(t *testing.T) {
	o := resolve(t, "sku:<path:id>", "/sku", httptest.NewRequest(http.MethodGet, "/sku?id=7", nil))
	fe := wantFieldErr(t, o, "<path:id>", ErrMissingField)
	if fe.Reason != "no such path parameter" {
		t.Fatalf("Reason = %q", fe.Reason)
	}
}

func TestResolve_QueryParameterFirstValue(t *testing.T) {
	o := resolve(t, "page:<query:p>", "/list", httptest.NewRequest(http.MethodGet, "/list?p=a%20b&p=second", nil))
	wantKey(t, o, "page:a b")
}

func TestResolve_QueryParameterMissing(t *testing.T) {
	o := resolve(t, "page:<query:p>", "/list", httptest.NewRequest(http.MethodGet, "/list?q=1", nil))
	wantFieldErr(t, o, "<query:p>", ErrMissingField)
}

func TestResolve_HeaderCaseInsensitiveFirstValue(t *testing.T) {
	req := httptest.NewRequest(http.MethodGet, "/me", nil)
	req.Header.Add("x-user-id", "u-1")
	req.Header.Add("X-User-ID", "u-2")
	o := resolve(t, "user:<header:X-USER-ID>", "/me", req)
	wantKey(t, o, "user:u-1")
}

func TestResolve_HeaderMissing(t *testing.T) {
	o := resolve(t, "user:<header:X-User-ID>", "/me", httptest.NewRequest(http.MethodGet, "/me", nil))
	wantFieldErr(t, o, "<header:X-User-Id>", ErrMissingField)
}

type userID struct{ n int }

func (u userID) String() string { return "U" + string(rune('0'+u.n)) }

func TestResolve_CtxValuesStringify(t *testing.T) {
	tests := []struct {
		value any
		want  string
	}{
		{"alice", "alice"},
		{[]byte("bytes"), "bytes"},
		{42, "42"},
		{int8(-8), "-8"},
		{int16(16), "16"},
		{int32(-32), "-32"},
		{int64(-9223372036854775808), "-9223372036854775808"},
		{uint(7), "7"},
		{uint8(255), "255"},
		{uint16(65535), "65535"},
		{uint32(32), "32"},
		{uint64(18446744073709551615), "18446744073709551615"},
		{true, "true"},
		{false, "false"},
		{42.0, "42"},
		{1.5, "1.5"},
		{float32(0.1), "0.1"},
		{1e21, "1000000000000000000000"},
		{json.Number("12.50"), "12.50"},
		{userID{7}, "U7"},
	}
	for _, tt := range tests {
		o := resolveOn(t, "u:<ctx:user>", "/", httptest.NewRequest(http.MethodGet, "/", nil),
			[]gin.HandlerFunc{setCtx("user", tt.value)}, nil)
		if o.err != nil || o.key != "u:"+tt.want {
			t.Errorf("ctx value %#v: Resolve = %q, %v; want %q", tt.value, o.key, o.err, "u:"+tt.want)
		}
	}
}

func TestResolve_CtxNegativeZeroFloat(t *testing.T) {
	negZero := math.Copysign(0, -1)
	o := resolveOn(t, "u:<ctx:user>", "/", httptest.NewRequest(http.MethodGet, "/", nil),
		[]gin.HandlerFunc{func(c *gin.Context) { c.Set("user", negZero) }}, nil)
	wantKey(t, o, "u:0")
}

func TestResolve_CtxUnsupportedTypeIsAServerError(t *testing.T) {
	nan := 0.0
	nan /= nan
	for _, v := range []any{struct{ ID int }{1}, map[string]int{"a": 1}, []int{1}, nan, errors.New("e")} {
		o := resolveOn(t, "u:<ctx:user>", "/", httptest.NewRequest(http.MethodGet, "/", nil),
			[]gin.HandlerFunc{setCtx("user", v)}, nil)
		fe := wantFieldErr(t, o, "<ctx:user>", ErrValueType)
		if Status(o.err) != http.StatusInternalServerError {
			t.Errorf("ctx value %#v: Status = %d, want 500", v, Status(o.err))
		}
		if !strings.HasPrefix(fe.Reason, "unsupported value type") {
			t.Errorf("ctx value %#v: Reason = %q", v, fe.Reason)
		}
	}
}

func TestResolve_CtxUnsetOrNilIsMissing(t *testing.T) {
	o := resolve(t, "u:<ctx:user>", "/", httptest.NewRequest(http.MethodGet, "/", nil))
	wantFieldErr(t, o, "<ctx:user>", ErrMissingField)
	o = resolveOn(t, "u:<ctx:user>", "/", httptest.NewRequest(http.MethodGet, "/", nil),
		[]gin.HandlerFunc{setCtx("user", nil)}, nil)
	wantFieldErr(t, o, "<ctx:user>", ErrMissingField)
}

func TestResolve_AnyPrefersPathOverQueryAndBody(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku/:id", jsonPost("/sku/path?id=query", `{"id":"body"}`))
	wantKey(t, o, "sku:path")
}

func TestResolve_AnyPrefersQueryOverBody(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku", jsonPost("/sku?id=query", `{"id":"body"}`))
	wantKey(t, o, "sku:query")
}

func TestResolve_AnyFallsBackToJSONBody(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku", jsonPost("/sku?other=1", `{"id":"body"}`))
	wantKey(t, o, "sku:body")
}

func TestResolve_AnyFallsBackToFormBody(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku", formPost(http.MethodPost, "/sku", "id=form&x=1"))
	wantKey(t, o, "sku:form")
}

func TestResolve_AnyFirstSourceDecidesEvenWhenEmpty(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku", jsonPost("/sku?id=", `{"id":"body"}`))
	fe := wantFieldErr(t, o, "<id>", ErrMissingField)
	if fe.Reason != "value is empty" {
		t.Fatalf("Reason = %q", fe.Reason)
	}
}

func TestResolve_AnyMissingEverywhereNamesTheSources(t *testing.T) {
	o := resolve(t, "sku:<id>", "/sku", jsonPost("/sku?x=1", `{"sku":"1"}`))
	fe := wantFieldErr(t, o, "<id>", ErrMissingField)
	if want := "ginmw: field <id>: not in path, query or body"; o.err.Error() != want || fe.Reason != "not in path, query or body" {
		t.Fatalf("error = %q, want %q", o.err, want)
	}
	o = resolve(t, "sku:<id>", "/sku", httptest.NewRequest(http.MethodGet, "/sku", nil))
	wantFieldErr(t, o, "<id>", ErrMissingField)
}

// failingBody fails the test if anything reads it.
type failingBody struct{ t *testing.T }

func (b failingBody) Read([]byte) (int, error) {
	b.t.Error("the body was read")
	return 0, io.ErrUnexpectedEOF
}
func (failingBody) Close() error { return nil }

func TestResolve_AnyDoesNotReadTheBodyWhenPathOrQueryHasIt(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/sku/1", nil)
	req.Body = failingBody{t}
	wantKey(t, resolve(t, "sku:<id>", "/sku/:id", req), "sku:1")
	req = httptest.NewRequest(http.MethodPost, "/sku?id=2", nil)
	req.Body = failingBody{t}
	wantKey(t, resolve(t, "sku:<id>", "/sku", req), "sku:2")
}

func TestResolve_TemplateWithoutBodyFieldsNeverReadsTheBody(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/sku/1?p=2", nil)
	req.Body = failingBody{t}
	req.Header.Set("X-A", "3")
	o := resolveOn(t, "<path:id>:<query:p>:<header:X-A>:<ctx:u>", "/sku/:id", req, []gin.HandlerFunc{setCtx("u", 4)}, nil)
	wantKey(t, o, "1:2:3:4")
}

func TestResolve_BodyDottedJSONPaths(t *testing.T) {
	body := `{
		"order": {"sku": "s-1", "qty": 3, "gift": false, "meta": {"channel": "app"}},
		"items": [{"sku": "a"}, {"sku": "b"}],
		"paid": true,
		"esc": "caf\u00e9 \"x\" \/ \ud83d\ude00",
		"0": "zero-key"
	}`
	tests := []struct {
		path, want string
	}{
		{"order.sku", "s-1"},
		{"order.qty", "3"},
		{"order.gift", "false"},
		{"order.meta.channel", "app"},
		{"items.1.sku", "b"},
		{"items.0.sku", "a"},
		{"paid", "true"},
		{"esc", "café \"x\" / 😀"},
		{"0", "zero-key"},
	}
	for _, tt := range tests {
		o := resolve(t, "k:<body:"+tt.path+">", "/o", jsonPost("/o", body))
		if o.err != nil || o.key != "k:"+tt.want {
			t.Errorf("<body:%s>: Resolve = %q, %v; want %q", tt.path, o.key, o.err, "k:"+tt.want)
		}
	}
}

func TestResolve_BodyPathsThatNameNothingAreMissing(t *testing.T) {
	body := `{"order": {"sku": "s-1"}, "items": [{"sku": "a"}], "n": 1}`
	for _, path := range []string{"nope", "order.nope", "order.sku.deeper", "items.1", "items.01", "items.x", "n.x"} {
		o := resolve(t, "k:<body:"+path+">", "/o", jsonPost("/o", body))
		wantFieldErr(t, o, "<body:"+path+">", ErrMissingField)
	}
}

func TestResolve_BodyJSONNumbersStringify(t *testing.T) {
	tests := []struct {
		number, want string
	}{
		{"42", "42"},
		{"-7", "-7"},
		{"0", "0"},
		{"-0", "0"},
		{"12345678901234567890123", "12345678901234567890123"},
		{"42.0", "42"},
		{"4.2e1", "42"},
		{"1.50", "1.5"},
		{"-0.0", "0"},
		{"1E-3", "0.001"},
	}
	for _, tt := range tests {
		o := resolve(t, "k:<body:n>", "/o", jsonPost("/o", `{"n":`+tt.number+`}`))
		if o.err != nil || o.key != "k:"+tt.want {
			t.Errorf("number %s: Resolve = %q, %v; want %q", tt.number, o.key, o.err, "k:"+tt.want)
		}
	}
}

func TestResolve_BodyNumberBeyondFloat64IsUnsafe(t *testing.T) {
	o := resolve(t, "k:<body:n>", "/o", jsonPost("/o", `{"n":1e400}`))
	wantFieldErr(t, o, "<body:n>", ErrUnsafeValue)
}

func TestResolve_BodyObjectOrArrayIsUnsafe(t *testing.T) {
	for body, reason := range map[string]string{
		`{"order":{"sku":1}}`: "value is an object, not a string, number or boolean",
		`{"order":[1]}`:       "value is an array, not a string, number or boolean",
	} {
		o := resolve(t, "k:<body:order>", "/o", jsonPost("/o", body))
		fe := wantFieldErr(t, o, "<body:order>", ErrUnsafeValue)
		if fe.Reason != reason {
			t.Errorf("body %s: Reason = %q, want %q", body, fe.Reason, reason)
		}
	}
}

func TestResolve_BodyNullAndEmptyStringAreMissing(t *testing.T) {
	for _, body := range []string{`{"id":null}`, `{"id":""}`, ``, `   `} {
		o := resolve(t, "k:<body:id>", "/o", jsonPost("/o", body))
		wantFieldErr(t, o, "<body:id>", ErrMissingField)
	}
}

func TestResolve_BodyKeysMatchCaseInsensitivelyLikeEncodingJSON(t *testing.T) {
	for _, body := range []string{
		`{"SKU":"a"}`,
		`{"Sku":"a"}`,
		`{"\u0073ku":"a"}`,
		"{\"s\u212Au\":\"a\"}", // the Kelvin sign folds to k
	} {
		o := resolve(t, "k:<body:sku>", "/o", jsonPost("/o", body))
		if o.err != nil || o.key != "k:a" {
			t.Errorf("body %s: Resolve = %q, %v; want k:a", body, o.key, o.err)
		}
		// A handler binding a struct sees the same value.
		var v struct {
			SKU string `json:"sku"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil || v.SKU != "a" {
			t.Errorf("body %s: encoding/json binds %+v, %v", body, v, err)
		}
	}
}

func TestResolve_BodyMemberTwiceIsBadBody(t *testing.T) {
	for _, body := range []string{`{"sku":"a","sku":"b"}`, `{"sku":"a","SKU":"b"}`, `{"o":{"sku":1},"O":{"sku":2}}`} {
		tmpl := "k:<body:sku>"
		if strings.Contains(body, `"o"`) {
			tmpl = "k:<body:o.sku>"
		}
		o := resolve(t, tmpl, "/o", jsonPost("/o", body))
		fe := wantFieldErr(t, o, tmpl[2:], ErrBadBody)
		if !strings.Contains(fe.Reason, "more than once") {
			t.Errorf("body %s: Reason = %q", body, fe.Reason)
		}
	}
}

func TestResolve_BodyNotJSONIsBadBody(t *testing.T) {
	for body, reason := range map[string]string{
		`{"sku":`:    "bad body: not valid JSON (error at byte 7)",
		`{"sku":1}x`: "bad body: not valid JSON (error at byte 9)",
		`sku=1`:      "bad body: not valid JSON (error at byte 0)",
		`["sku"]`:    "bad body: JSON body is not an object",
		`"sku"`:      "bad body: JSON body is not an object",
	} {
		o := resolve(t, "k:<body:sku>", "/o", jsonPost("/o", body))
		fe := wantFieldErr(t, o, "<body:sku>", ErrBadBody)
		if fe.Reason != reason {
			t.Errorf("body %s: Reason = %q, want %q", body, fe.Reason, reason)
		}
	}
}

func TestResolve_BodyWithoutContentTypeIsReadAsJSON(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/o", strings.NewReader(`{"sku":"a"}`))
	wantKey(t, resolve(t, "k:<body:sku>", "/o", req), "k:a")
}

func TestResolve_FormBodyFieldAndHandlerStillReadsForm(t *testing.T) {
	req := formPost(http.MethodPost, "/o?sku=query", "sku=form%20value&order.no=7&sku=second")
	var postForm, postFormDotted string
	o := resolveOn(t, "k:<body:sku>:<body:order.no>", "/o", req, nil, func(c *gin.Context) {
		postForm, postFormDotted = c.PostForm("sku"), c.PostForm("order.no")
	})
	wantKey(t, o, "k:form value:7")
	if postForm != "form value" || postFormDotted != "7" {
		t.Fatalf("handler c.PostForm = %q, %q after resolving", postForm, postFormDotted)
	}
}

func TestResolve_FormBodyOnGETIsIgnoredLikePostForm(t *testing.T) {
	req := formPost(http.MethodGet, "/o", "sku=form")
	var handlerSees string
	o := resolveOn(t, "k:<body:sku>", "/o", req, nil, func(c *gin.Context) { handlerSees = c.PostForm("sku") })
	wantFieldErr(t, o, "<body:sku>", ErrMissingField)
	if handlerSees != "" {
		t.Fatalf("handler saw %q; the test premise is wrong", handlerSees)
	}
}

func TestResolve_MultipartFormField(t *testing.T) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("sku", "mp-1")
	fw, _ := mw.CreateFormFile("sku_file", "a.txt")
	_, _ = fw.Write([]byte("file content"))
	_ = mw.Close()
	req := httptest.NewRequest(http.MethodPost, "/o", &buf)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	var handlerSees string
	o := resolveOn(t, "k:<body:sku>", "/o", req, nil, func(c *gin.Context) { handlerSees = c.PostForm("sku") })
	wantKey(t, o, "k:mp-1")
	if handlerSees != "mp-1" {
		t.Fatalf("handler c.PostForm(sku) = %q after resolving", handlerSees)
	}
}

func TestResolve_MultipartFilePartIsNotAField(t *testing.T) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("sku", "a.txt")
	_, _ = fw.Write([]byte("file content"))
	_ = mw.Close()
	req := httptest.NewRequest(http.MethodPost, "/o", &buf)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	wantFieldErr(t, resolve(t, "k:<body:sku>", "/o", req), "<body:sku>", ErrMissingField)
}

func TestResolve_MalformedMultipartIsBadBody(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/o", strings.NewReader("not multipart"))
	req.Header.Set("Content-Type", "multipart/form-data; boundary=xyz")
	wantFieldErr(t, resolve(t, "k:<body:sku>", "/o", req), "<body:sku>", ErrBadBody)
	req = httptest.NewRequest(http.MethodPost, "/o", strings.NewReader("x"))
	req.Header.Set("Content-Type", "multipart/form-data")
	wantFieldErr(t, resolve(t, "k:<body:sku>", "/o", req), "<body:sku>", ErrBadBody)
}

func TestResolve_FieldFollowedByFieldEscapesItsSeparator(t *testing.T) {
	tests := []struct {
		tmpl, user, order, want string
	}{
		{"order:<ctx:u>:<body:o>", "1:2", "3", "order:1%3A2:3"},
		{"order:<ctx:u>:<body:o>", "1", "2:3", "order:1:2:3"},
		{"order:<ctx:u>:<body:o>", "50%", "x%", "order:50%25:x%"},
		{"order:<ctx:u>·<body:o>", "a·b", "c", "order:a%C2%B7b·c"},
		{"{user:<ctx:u>}:<body:o>", "a:b", "c:d", "{user:a:b}:c:d"},
	}
	for _, tt := range tests {
		o := resolveOn(t, tt.tmpl, "/o", jsonPost("/o", `{"o":"`+tt.order+`"}`), []gin.HandlerFunc{setCtx("u", tt.user)}, nil)
		if o.err != nil || o.key != tt.want {
			t.Errorf("%s with u=%q o=%q: Resolve = %q, %v; want %q", tt.tmpl, tt.user, tt.order, o.key, o.err, tt.want)
		}
	}
}

func TestResolve_SeveralTemplatesShareOneBodyRead(t *testing.T) {
	reads := 0
	body := `{"order_no":"n-1","sku":"s-1"}`
	req := jsonPost("/o", body)
	req.Body = countingBody{r: strings.NewReader(body), n: &reads}
	lockKey := MustParseTemplate("sku:<body:sku>")
	idemKey := MustParseTemplate("order:<ctx:u>:<body:order_no>")
	var got []string
	var bound struct{ SKU string }
	r := gin.New()
	r.POST("/o", setCtx("u", 9), func(c *gin.Context) {
		for _, tpl := range []*Template{lockKey, idemKey} {
			k, err := tpl.Resolve(c, 0)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, k)
		}
		if s := requestOf(c); !s.parsed || s.parseErr != nil {
			t.Fatalf("body state after resolving: %+v", s)
		}
		if err := c.ShouldBindJSON(&bound); err != nil {
			t.Fatalf("handler ShouldBindJSON after resolving: %v", err)
		}
	})
	r.ServeHTTP(httptest.NewRecorder(), req)
	if strings.Join(got, " ") != "sku:s-1 order:9:n-1" || bound.SKU != "s-1" {
		t.Fatalf("keys %v, handler bound %+v", got, bound)
	}
	if reads == 0 || reads > 2 {
		t.Fatalf("original body read %d times, want one read to the end", reads)
	}
}

// countingBody counts Read calls on the original body.
type countingBody struct {
	r io.Reader
	n *int
}

func (b countingBody) Read(p []byte) (int, error) { *b.n++; return b.r.Read(p) }
func (countingBody) Close() error                 { return nil }

func TestResolve_HostHeader(t *testing.T) {
	req := httptest.NewRequest(http.MethodGet, "http://shop.example/", nil)
	wantKey(t, resolve(t, "h:<header:host>", "/", req), "h:shop.example")
}

func TestResolve_ZeroTemplateIsAnErrorNotAnEmptyKey(t *testing.T) {
	var zero Template
	c := testContext(httptest.NewRequest(http.MethodGet, "/", nil))
	if key, err := zero.Resolve(c, 0); !errors.Is(err, ErrBadTemplate) || key != "" || Status(err) != http.StatusInternalServerError {
		t.Fatalf("zero Template: Resolve = %q, %v", key, err)
	}
}

func TestResolve_BodyNumberLongerThan128BytesIsUnsafe(t *testing.T) {
	n := "1." + strings.Repeat("0", 127)
	o := resolve(t, "k:<body:n>", "/o", jsonPost("/o", `{"n":`+n+`}`))
	fe := wantFieldErr(t, o, "<body:n>", ErrUnsafeValue)
	if fe.Reason != "value longer than 128 bytes" {
		t.Fatalf("Reason = %q", fe.Reason)
	}
}

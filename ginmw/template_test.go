package ginmw

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseTemplate_FieldsSourcesAndBodyNeed(t *testing.T) {
	tests := []struct {
		text      string
		fields    []Field
		canonical string
		needsBody bool
	}{
		{"global", nil, "global", false},
		{"sku:<id>", []Field{{SourceAny, "id"}}, "sku:<id>", true},
		{"sku:<path:id>", []Field{{SourcePath, "id"}}, "sku:<path:id>", false},
		{"q:<query:page_no>", []Field{{SourceQuery, "page_no"}}, "q:<query:page_no>", false},
		{"u:<header:x-user-id>", []Field{{SourceHeader, "X-User-Id"}}, "u:<header:X-User-Id>", false},
		{"o:<body:order.sku>", []Field{{SourceBody, "order.sku"}}, "o:<body:order.sku>", true},
		{"<ctx:user_id>", []Field{{SourceCtx, "user_id"}}, "<ctx:user_id>", false},
		{"order:<ctx:user_id>:<body:order_no>", []Field{{SourceCtx, "user_id"}, {SourceBody, "order_no"}}, "order:<ctx:user_id>:<body:order_no>", true},
		{"{user:<ctx:user_id>}:order", []Field{{SourceCtx, "user_id"}}, "{user:<ctx:user_id>}:order", false},
		{"库存:<path:sku>", []Field{{SourcePath, "sku"}}, "库存:<path:sku>", false},
		{"<body:items.0.sku>-<header:X-A>", []Field{{SourceBody, "items.0.sku"}, {SourceHeader, "X-A"}}, "<body:items.0.sku>-<header:X-A>", true},
	}
	for _, tt := range tests {
		tpl, err := ParseTemplate(tt.text)
		if err != nil {
			t.Fatalf("ParseTemplate(%q): %v", tt.text, err)
		}
		if got := tpl.Fields(); !slices.Equal(got, tt.fields) {
			t.Errorf("ParseTemplate(%q).Fields() = %v, want %v", tt.text, got, tt.fields)
		}
		if got := tpl.String(); got != tt.canonical {
			t.Errorf("ParseTemplate(%q).String() = %q, want %q", tt.text, got, tt.canonical)
		}
		if got := tpl.NeedsBody(); got != tt.needsBody {
			t.Errorf("ParseTemplate(%q).NeedsBody() = %v, want %v", tt.text, got, tt.needsBody)
		}
	}
}

func TestParseTemplate_ErrorsShowTemplateAndColumn(t *testing.T) {
	tests := []struct {
		text string
		want string
	}{
		{"", `ginmw: template "" column 1: empty template`},
		{"sku:<id", `ginmw: template "sku:<id" column 5: unclosed "<"`},
		{"sku:<", `ginmw: template "sku:<" column 5: unclosed "<"`},
		{"a<b<c>", `ginmw: template "a<b<c>" column 2: unclosed "<"`},
		{"sku:<>", `ginmw: template "sku:<>" column 6: empty field name`},
		{"sku:<path:>", `ginmw: template "sku:<path:>" column 11: empty field name`},
		{"sku:<:id>", `ginmw: template "sku:<:id>" column 6: empty source before ":"`},
		{"sku:<foo:id>", `ginmw: template "sku:<foo:id>" column 6: unknown source "foo" (want path, query, header, body or ctx)`},
		{"sku:<PATH:id>", `ginmw: template "sku:<PATH:id>" column 6: unknown source "PATH" (want path, query, header, body or ctx)`},
		{"sku:<p th:id>", `ginmw: template "sku:<p th:id>" column 7: invalid character " " in field name (want letters, digits, _ - .)`},
		{"sku:<i d>", `ginmw: template "sku:<i d>" column 7: invalid character " " in field name (want letters, digits, _ - .)`},
		{"sku:<id!>", `ginmw: template "sku:<id!>" column 8: invalid character "!" in field name (want letters, digits, _ - .)`},
		{"sku:<body:a{b>", `ginmw: template "sku:<body:a{b>" column 12: invalid character "{" in field name (want letters, digits, _ - .)`},
		{"sku:<ctx:ü>", `ginmw: template "sku:<ctx:ü>" column 10: invalid character "ü" in field name (want letters, digits, _ - .)`},
		{"sku:<ctx:\x01>", `ginmw: template "sku:<ctx:\x01>" column 10: invalid character U+0001 in field name (want letters, digits, _ - .)`},
		{"sku:<ctx:\xff>", `ginmw: template "sku:<ctx:\xff>" column 10: invalid UTF-8 in field name`},
		{"sku:<body:a:b>", `ginmw: template "sku:<body:a:b>" column 12: second ":" in field`},
		{"sku:<a.b>", `ginmw: template "sku:<a.b>" column 7: "." in a field without a source; write <body:a.b>, <query:a.b>, ...`},
		{"sku:<body:a..b>", `ginmw: template "sku:<body:a..b>" column 13: empty segment in body path`},
		{"sku:<body:.a>", `ginmw: template "sku:<body:.a>" column 11: empty segment in body path`},
		{"sku:<body:a.>", `ginmw: template "sku:<body:a.>" column 13: empty segment in body path`},
		{"sku:id>", `ginmw: template "sku:id>" column 7: ">" without "<"`},
		{"<id>>", `ginmw: template "<id>>" column 5: ">" without "<"`},
		{"<a><b>", `ginmw: template "<a><b>" column 4: field must be separated from the previous field by literal text`},
		{"sku\n:<id>", `ginmw: template "sku\n:<id>" column 4: control character U+000A in literal text`},
		{"sku\x00<id>", `ginmw: template "sku\x00<id>" column 4: control character U+0000 in literal text`},
		{"sku\x7f<id>", `ginmw: template "sku\x7f<id>" column 4: control character U+007F in literal text`},
		{"sku\u0085<id>", `ginmw: template "sku\u0085<id>" column 4: control character U+0085 in literal text`},
		{"sku\xff<id>", `ginmw: template "sku\xff<id>" column 4: invalid UTF-8 in literal text`},
		{"库存:<id", `ginmw: template "库存:<id" column 4: unclosed "<"`},
	}
	for _, tt := range tests {
		_, err := ParseTemplate(tt.text)
		if err == nil {
			t.Errorf("ParseTemplate(%q) succeeded, want %s", tt.text, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseTemplate(%q):\n got %s\nwant %s", tt.text, err, tt.want)
		}
		var te *TemplateError
		if !errors.As(err, &te) || !errors.Is(err, ErrBadTemplate) {
			t.Errorf("ParseTemplate(%q) error %T does not match *TemplateError and ErrBadTemplate", tt.text, err)
		}
	}
}

func TestMustParseTemplate_PanicsWithTheTemplateError(t *testing.T) {
	defer func() {
		r := recover()
		err, ok := r.(error)
		if !ok || !errors.Is(err, ErrBadTemplate) || !strings.Contains(err.Error(), `"sku:<id" column 5`) {
			t.Fatalf("panic value = %v, want the template error", r)
		}
	}()
	MustParseTemplate("sku:<id")
}

func TestTemplate_FieldsIsACopy(t *testing.T) {
	tpl := MustParseTemplate("sku:<id>")
	tpl.Fields()[0].Name = "changed"
	if got := tpl.Fields()[0].Name; got != "id" {
		t.Fatalf("Fields()[0].Name = %q after modifying a returned slice, want id", got)
	}
}

func TestTemplate_CheckRouteFindsPathFieldsTheRouteLacks(t *testing.T) {
	tests := []struct {
		tmpl, route string
		ok          bool
	}{
		{"sku:<path:sku>", "/api/seckill/:sku", true},
		{"f:<path:file>", "/static/*file", true},
		{"sku:<path:id>", "/api/seckill/:sku", false},
		{"sku:<path:sku>", "/api/seckill/sku", false},
		{"sku:<id>", "/api/seckill/:sku", true}, // may come from query or body
		{"u:<ctx:user>:<path:a>-<path:b>", "/x/:a/y/:b", true},
		{"u:<path:a>-<path:b>", "/x/:a/y", false},
	}
	for _, tt := range tests {
		err := MustParseTemplate(tt.tmpl).CheckRoute(tt.route)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrBadTemplate)) {
			t.Errorf("%s on %s: CheckRoute = %v, want ok=%v", tt.tmpl, tt.route, err, tt.ok)
		}
	}
	err := MustParseTemplate("sku:<path:id>").CheckRoute("/api/seckill/:sku")
	if want := `ginmw: bad template: template "sku:<path:id>": route "/api/seckill/:sku" has no path parameter "id"`; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
}

package ginmw

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func canonical(t testing.TB, doc string) (string, error) {
	t.Helper()
	var b bytes.Buffer
	err := CanonicalJSON(&b, []byte(doc))
	return b.String(), err
}

func TestCanonicalJSON_WritesOneFormPerBinding(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{` { "b" : [ 1 , {"y":2,"x":1} ] , "a" : "s" } `, `{"a":"s","b":[1,{"x":1,"y":2}]}`},
		{`{"\u0061":"\u00e9\/\"\\\n"}`, `{"a":"é/\"\\\u000a"}`},
		{`"\ud83d\ude00 \ud800"`, `"😀 ` + "\uFFFD" + `"`},
		{"\"\xff\"", "\"\uFFFD\""},
		{`[1.0, 1e2, -0, 10]`, `[1.0,1e2,-0,10]`},      // numbers as written
		{`{"B":1,"a":2,"C":3}`, `{"a":2,"B":1,"C":3}`}, // sorted by folded name
		{`{}`, `{}`}, {`[]`, `[]`}, {`[{},[],{"a":[]}]`, `[{},[],{"a":[]}]`},
		{`{"a":{"c":{"e":1,"d":2},"b":[{"g":1,"f":2}]},"0":null}`, `{"0":null,"a":{"b":[{"f":2,"g":1}],"c":{"d":2,"e":1}}}`},
	} {
		got, err := canonical(t, tc.in)
		if err != nil || got != tc.want {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestCanonicalJSON_RefusesMembersThatBindToOneField(t *testing.T) {
	for _, doc := range []string{
		`{"a":1,"A":2}`, `{"a":1,"a":1}`, `{"sku":"x","\u0053KU":"y"}`, `{"k":1,"\u212a":2}`,
		`[{"x":{"Name":1,"nAME":2}}]`, "{\"\xff\":1,\"\xfe\":2}",
	} {
		got, err := canonical(t, doc)
		if !errors.Is(err, ErrBadBody) || !strings.Contains(err.Error(), "differ only in case") {
			t.Errorf("CanonicalJSON(%s) = %s, %v; want ErrBadBody", doc, got, err)
		}
		if strings.Contains(err.Error(), "Name") || strings.Contains(err.Error(), "sku") {
			t.Errorf("the error echoes the document: %v", err)
		}
	}
	for _, doc := range []string{`{"a":`, `{"a":1} 2`, ``, `{'a':1}`} {
		if _, err := canonical(t, doc); !errors.Is(err, ErrBadBody) {
			t.Errorf("CanonicalJSON(%q): %v, want ErrBadBody", doc, err)
		}
	}
}

func TestCanonicalJSONFields_FindsMembersAsBindingDoes(t *testing.T) {
	var b bytes.Buffer
	err := CanonicalJSONFields(&b, []byte(`{"Order":{"SKU":"a","n":{"y":1,"x":2}},"items":[3,4]}`), []string{"order.sku", "order.n", "items.1", "missing"})
	if want := `["a",{"x":2,"y":1},4,null]`; err != nil || b.String() != want {
		t.Fatalf("got %s, %v; want %s", b.String(), err, want)
	}
	b.Reset()
	if err := CanonicalJSONFields(&b, []byte(`{"sku":1,"SKU":2}`), []string{"sku"}); !errors.Is(err, ErrBadBody) {
		t.Fatalf("two members for one field: %v", err)
	}
}

// bound is what a handler might bind a body into: names matched under case
// folding, nested values of any shape.
type bound struct {
	A   any      `json:"a"`
	B   *bound   `json:"b"`
	SKU string   `json:"sku"`
	K   any      `json:"k"`
	L   []bound  `json:"l"`
	M   []string `json:"m"`
}

// bindings returns how encoding/json binds doc: into any and into a struct.
func bindings(doc []byte) (anyV any, anyErr bool, st bound, stErr bool) {
	anyErr = json.Unmarshal(doc, &anyV) != nil
	stErr = json.Unmarshal(doc, &st) != nil
	return
}

// FuzzCanonicalJSON: a document binds like its canonical form, into any
// and into a struct; the canonical form is its own canonical form; and a
// document is refused only as not JSON or for members that bind to one
// field.
func FuzzCanonicalJSON(f *testing.F) {
	for _, seed := range []string{
		`{"a":1,"A":2}`, `{"b":{"a":[1,{"sku":"x"}]},"k":"\u212a"}`, `{"sku":"\u00e9","m":["\ud800","x"]}`,
		"{\"a\":\"\xff\xfe\"}", `[{"y":1,"x":[]},{}]`, `{"l":[{"a":1},{"A":1}]}`, `1e400`, `"\u0000"`,
		`{"\u0073ku":"a"}`, `{"K":1}`, `{"a":{"b":{"c":{}}}}`, `{"ab":1,"aB":2}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var c bytes.Buffer
		err := CanonicalJSON(&c, doc)
		if err != nil {
			if !errors.Is(err, ErrBadBody) {
				t.Fatalf("CanonicalJSON(%q): %v is not ErrBadBody", doc, err)
			}
			if json.Valid(doc) && !strings.Contains(err.Error(), "differ only in case") {
				t.Fatalf("valid %q refused: %v", doc, err)
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("invalid %q accepted as %s", doc, c.Bytes())
		}
		a1, ae1, s1, se1 := bindings(doc)
		a2, ae2, s2, se2 := bindings(c.Bytes())
		if ae1 != ae2 || !reflect.DeepEqual(a1, a2) {
			t.Fatalf("%q binds into any as %#v (err %v), its canonical form %s as %#v (err %v)", doc, a1, ae1, c.Bytes(), a2, ae2)
		}
		if se1 != se2 || (!se1 && !reflect.DeepEqual(s1, s2)) {
			t.Fatalf("%q binds into a struct as %+v (err %v), its canonical form %s as %+v (err %v)", doc, s1, se1, c.Bytes(), s2, se2)
		}
		var again bytes.Buffer
		if err := CanonicalJSON(&again, c.Bytes()); err != nil || !bytes.Equal(again.Bytes(), c.Bytes()) {
			t.Fatalf("the canonical form %s of %q is not canonical: %s, %v", c.Bytes(), doc, again.Bytes(), err)
		}
	})
}

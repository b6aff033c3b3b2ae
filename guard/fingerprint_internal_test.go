package guard

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// fpContext returns the gin context of a POST /pay/:sku request.
func fpContext(path, contentType string, body []byte) *gin.Context {
	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest("POST", path, strings.NewReader(string(body)))
	c.Request.Header.Set("Content-Type", contentType)
	c.Params = gin.Params{{Key: "sku", Value: strings.TrimPrefix(strings.SplitN(path, "?", 2)[0], "/pay/")}}
	return c
}

// order is what a handler might bind a body into; names are matched to
// fields under case folding.
type order struct {
	Amount any      `json:"amount"`
	SKU    string   `json:"sku"`
	Note   *string  `json:"note"`
	Items  []order  `json:"items"`
	Tags   []string `json:"tags"`
	Inner  *order   `json:"inner"`
}

// FuzzFingerprint_OneFingerprintBindsAlike: two requests with one
// fingerprint are bound alike by the handler, into a struct and into a
// map, whatever their bodies.
func FuzzFingerprint_OneFingerprintBindsAlike(f *testing.F) {
	for _, pair := range [][2]string{
		{`{"a":1,"A":2}`, `{"A":2,"a":1}`},
		{`{"amount":1,"AMOUNT":2}`, `{"AMOUNT":2,"amount":1}`},
		{`{"amount":1,"sku":"a"}`, ` { "sku" : "a", "amount" : 1 } `},
		{`{"sku":"\u0041"}`, `{"sku":"A"}`},
		{`{"sku":"k"}`, `{"sku":"\u212a"}`},
		{`{"k":1}`, `{"\u212a":1}`},
		{"{\"sku\":\"\xff\"}", `{"sku":"\ufffd"}`},
		{`{"sku":"\ud800"}`, `{"sku":"\ufffd"}`},
		{`{"amount":1.0}`, `{"amount":1}`},
		{`{"items":[{"sku":"a"},{"SKU":"b"}]}`, `{"items":[{"SKU":"a"},{"sku":"b"}]}`},
		{`{"inner":{"note":null}}`, `{"inner":{}}`},
		{`[1,2]`, `[2,1]`},
		{`{"tags":["x","y"]}`, `{"tags":["y","x"]}`},
	} {
		f.Add([]byte(pair[0]), []byte(pair[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		for _, fp := range []Fingerprint{FingerprintAuto, FingerprintFields("sku", "items.0", "inner")} {
			sa, errA := fp.sum(fpContext("/pay/1", "application/json", a), "/pay/:sku", a)
			sb, errB := fp.sum(fpContext("/pay/1", "application/json", b), "/pay/:sku", b)
			if errA != nil || errB != nil || sa != sb {
				continue
			}
			var ma, mb any
			ea, eb := json.Unmarshal(a, &ma), json.Unmarshal(b, &mb)
			if fp.mode == fpAuto && ((ea == nil) != (eb == nil) || !reflect.DeepEqual(ma, mb)) {
				t.Fatalf("one fingerprint, two bindings into any:\n%q -> %#v (%v)\n%q -> %#v (%v)", a, ma, ea, b, mb, eb)
			}
			var oa, ob order
			ea, eb = json.Unmarshal(a, &oa), json.Unmarshal(b, &ob)
			if fp.mode == fpFields {
				// Only the named fields count.
				oa, ob = order{SKU: oa.SKU, Inner: oa.Inner}, order{SKU: ob.SKU, Inner: ob.Inner}
				if ea != nil || eb != nil {
					continue
				}
			}
			if (ea == nil) != (eb == nil) || (ea == nil && !reflect.DeepEqual(oa, ob)) {
				t.Fatalf("one fingerprint (%v), two bindings into a struct:\n%q -> %+v (%v)\n%q -> %+v (%v)", fp.mode, a, oa, ea, b, ob, eb)
			}
		}
	})
}

// bodies of 1 MiB: the realistic shape (an array of small objects) and the
// worst (one object of a great many one-letter members).
func bigBodies() map[string][]byte {
	var items strings.Builder
	items.WriteString(`{"items":[`)
	for i := 0; items.Len() < 1<<20-100; i++ {
		if i > 0 {
			items.WriteByte(',')
		}
		fmt.Fprintf(&items, `{"sku":"sku-%d","qty":%d,"note":"gift wrap, \u00e9 please"}`, i, i%7)
	}
	items.WriteString(`]}`)
	var flat strings.Builder
	flat.WriteString(`{`)
	for i := 0; flat.Len() < 1<<20-100; i++ {
		if i > 0 {
			flat.WriteByte(',')
		}
		fmt.Fprintf(&flat, `"%x":0`, i)
	}
	flat.WriteString(`}`)
	return map[string][]byte{"array of objects": []byte(items.String()), "flat object": []byte(flat.String())}
}

// allocated returns the bytes allocated by one run of f, the best of three.
func allocated(f func()) uint64 {
	best := ^uint64(0)
	for range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	return best
}

// TestFingerprint_MemoryIsBoundedByTheBody: fingerprinting a 1 MiB JSON body
// allocates at most a small multiple of the body, never a decoded copy of
// the document (which cost 42-60 times the body).
func TestFingerprint_MemoryIsBoundedByTheBody(t *testing.T) {
	for name, body := range bigBodies() {
		c := fpContext("/pay/1", "application/json", body)
		n := allocated(func() {
			if _, err := FingerprintAuto.sum(c, "/pay/:sku", body); err != nil {
				t.Fatal(err)
			}
		})
		limit := uint64(len(body)) / 4 // the note of where containers end, the buffer
		if name == "flat object" {
			limit = 4 * uint64(len(body)) // the members of the one object
		}
		t.Logf("%s (%d bytes): %d bytes allocated (%.2fx the body)", name, len(body), n, float64(n)/float64(len(body)))
		if n > limit {
			t.Errorf("%s: fingerprinting %d bytes allocated %d (%.1fx), want at most %d", name, len(body), n, float64(n)/float64(len(body)), limit)
		}
		fields := allocated(func() {
			if _, err := FingerprintFields("items.0.sku").sum(c, "/pay/:sku", body); err != nil {
				t.Fatal(err)
			}
		})
		if fields > 16<<10 {
			t.Errorf("%s: a fields fingerprint allocated %d bytes; it canonicalises only its fields", name, fields)
		}
	}
}

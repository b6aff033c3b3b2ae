package guard

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// routeOptionSamples holds one valid value of every exported constructor of
// a RouteOption, by name. The test below finds the constructors in the
// source, so an option added without a sample here fails it.
var routeOptionSamples = map[string]RouteOption{
	"Wait": Wait(time.Second), "Lease": Lease(time.Second), "Busy": Busy(503, "x"), "RetryAfter": RetryAfter(time.Second),
	"FailOpen": FailOpen(), "BodyLimit": BodyLimit(1024), "BodyTimeout": BodyTimeout(time.Second), "LongHold": LongHold(time.Second),
	"Combining": Combining(nopSession{}), "MaxBatch": MaxBatch(2), "MaxBatchTime": MaxBatchTime(time.Second),
	"IdempotencyHeader": IdempotencyHeader("X-Key"), "IdempotencyKey": IdempotencyKey("k:<body:n>"), "OptionalKey": OptionalKey(),
	"Scope": Scope("<ctx:user_id>"), "Unscoped": Unscoped(), "UseFingerprint": UseFingerprint(FingerprintRaw),
	"RecordTTL": RecordTTL(time.Hour), "InProgressLease": InProgressLease(time.Second), "WaitForFirst": WaitForFirst(time.Second),
	"StoreClientErrors": StoreClientErrors(), "StoreServerErrors": StoreServerErrors(), "MaxResponse": MaxResponse(1024),
	"ReplayHeaders": ReplayHeaders("Location"),
}

// nopSession is a Session that does nothing.
type nopSession struct{}

func (nopSession) Begin(ctx context.Context) (context.Context, error) { return ctx, nil }
func (nopSession) Savepoint(context.Context, string) error            { return nil }
func (nopSession) RollbackTo(context.Context, string) error           { return nil }
func (nopSession) End(context.Context, bool) error                    { return nil }

// routeOptionConstructors returns the exported functions of the package
// that return a RouteOption, and RouteOption's doc comment.
func routeOptionConstructors(t *testing.T) (names []string, doc string) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range pkgs["guard"].Files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil || !d.Name.IsExported() || d.Type.Results == nil || len(d.Type.Results.List) != 1 {
					continue
				}
				if id, ok := d.Type.Results.List[0].Type.(*ast.Ident); ok && id.Name == "RouteOption" {
					names = append(names, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok && ts.Name.Name == "RouteOption" {
						doc = d.Doc.Text()
					}
				}
			}
		}
	}
	sort.Strings(names)
	return names, doc
}

// usedBy says which middleware reads o: applied while building the other
// one, an option of one middleware is refused.
func usedBy(o RouteOption) string {
	byLock, byIdem := defaultRoute(), defaultRoute()
	applyOptions(&byLock, useLock, []RouteOption{o})
	applyOptions(&byIdem, useIdem, []RouteOption{o})
	refused := func(r route) bool {
		for _, err := range r.errs {
			if strings.Contains(err.Error(), "does nothing given to") {
				return true
			}
		}
		return false
	}
	switch {
	case refused(byLock):
		return "Idempotent"
	case refused(byIdem):
		return "Lock"
	}
	return "both"
}

// RouteOption's doc comment names every route option and says which
// middleware reads it, as the options themselves decide (it used to list
// them by hand and had left StoreClientErrors out).
func TestRouteOption_DocSaysWhichMiddlewareReadsEveryOption(t *testing.T) {
	names, doc := routeOptionConstructors(t)
	var sampled []string
	for n := range routeOptionSamples {
		sampled = append(sampled, n)
	}
	sort.Strings(sampled)
	if !slices.Equal(names, sampled) {
		t.Fatalf("route option constructors %v, samples %v: give every option a sample", names, sampled)
	}
	word := regexp.MustCompile(`\b[A-Z][A-Za-z]+\b`)
	mentioned := map[string]bool{}
	for _, w := range word.FindAllString(doc, -1) {
		mentioned[w] = true
	}
	listed := map[string]string{} // option -> the list it is in
	for _, line := range strings.Split(doc, "\n") {
		use, list, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-")), ": ")
		if !ok || (use != "Lock" && use != "Idempotent" && use != "both") {
			continue
		}
		for _, n := range word.FindAllString(list, -1) {
			listed[n] = use
		}
	}
	for _, n := range names {
		if !mentioned[n] {
			t.Errorf("RouteOption's doc comment does not name %s", n)
			continue
		}
		if got, want := listed[n], usedBy(routeOptionSamples[n]); got != want {
			t.Errorf("RouteOption's doc comment lists %s under %q; the option is read by %q", n, got, want)
		}
	}
}

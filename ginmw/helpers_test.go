package ginmw

import (
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/gin-gonic/gin"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}

// outcome is what a handler saw when it resolved a template.
type outcome struct {
	key string
	err error
}

// resolveOn serves req through a real gin engine that has route registered
// for req's method; before resolving tmpl, the handler chain runs mw (for
// example a middleware that sets ctx values); after resolving, it runs then
// (for example a check that the body still reads whole).
func resolveOn(t *testing.T, tmpl, route string, req *http.Request, mw []gin.HandlerFunc, then gin.HandlerFunc) outcome {
	t.Helper()
	tpl := MustParseTemplate(tmpl)
	var got outcome
	handlers := append(append([]gin.HandlerFunc(nil), mw...), func(c *gin.Context) {
		got.key, got.err = tpl.Resolve(c, 0)
		if then != nil {
			then(c)
		}
	})
	r := gin.New()
	r.Handle(req.Method, route, handlers...)
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	if w.Code == http.StatusNotFound {
		t.Fatalf("route %s %s did not match %s", req.Method, route, req.URL)
	}
	return got
}

// resolve is resolveOn without extra handlers.
func resolve(t *testing.T, tmpl, route string, req *http.Request) outcome {
	t.Helper()
	return resolveOn(t, tmpl, route, req, nil, nil)
}

// setCtx returns a middleware that stores v under key with c.Set.
func setCtx(key string, v any) gin.HandlerFunc {
	return func(c *gin.Context) { c.Set(key, v) }
}

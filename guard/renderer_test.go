package guard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/ginmw"
	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// TestWithRenderer_BusyIsAProblemDocument: with guard.WithRenderer(
// ginmw.ProblemJSON) a busy lock is answered as RFC 9457 problem details,
// through Lock and through Policies alike, with Retry-After kept.
func TestWithRenderer_BusyIsAProblemDocument(t *testing.T) {
	srv := testenv.Redis(t)
	pol, err := guard.ParsePolicies("inline.yaml", []byte("routes:\n  - route: POST /p/:id\n    lock: \"p:<id>\"\n    wait: 0s\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.POST("/l/:id", g.Lock("l:<id>", guard.Wait(0)), func(c *gin.Context) { c.Status(http.StatusNoContent) })
		r.Group("/").Use(g.Policies(pol)).POST("/p/:id", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	}, guard.WithRenderer(ginmw.ProblemJSON("")))

	other := lock.New(srv.Client())
	defer other.Close()
	for _, tc := range []struct{ key, url string }{{"l:1", "/l/1"}, {"p:1", "/p/1"}} {
		held, err := other.Mutex(tc.key).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		r := do(t, http.MethodPost, in.srv.URL+tc.url, "")
		other.Mutex(tc.key).Unlock(held)
		if r.status != http.StatusTooManyRequests || r.header.Get("Content-Type") != "application/problem+json" || r.header.Get("Retry-After") == "" {
			t.Errorf("%s while held elsewhere: %d %q Retry-After %q, want 429 application/problem+json", tc.url, r.status, r.header.Get("Content-Type"), r.header.Get("Retry-After"))
		}
		var p struct {
			Type, Title, Code string
			Status            int
		}
		if err := json.Unmarshal(r.body, &p); err != nil || p.Type != "about:blank" || p.Title != "Too Many Requests" || p.Status != 429 || p.Code != "busy" {
			t.Errorf("%s body %s (%v), want a problem document with code busy", tc.url, r.body, err)
		}
	}
}

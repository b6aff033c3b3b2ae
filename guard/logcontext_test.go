package guard_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// requestIDKey is the context key an earlier middleware stores a request
// id under, as tracing and request-id middleware do.
type requestIDKey struct{}

// contextLog is a slog.Handler that records the request id of the context
// of every record it handles.
type contextLog struct {
	mu  sync.Mutex
	ids map[string]string // message -> request id seen
}

func (h *contextLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *contextLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *contextLog) WithGroup(string) slog.Handler            { return h }
func (h *contextLog) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, _ := ctx.Value(requestIDKey{}).(string)
	h.ids[r.Message] = id
	return nil
}

// TestGuard_LogsCarryTheRequestContext: the Guard's log lines about a
// request are written with that request's context, so a handler can add
// its trace and request ids.
func TestGuard_LogsCarryTheRequestContext(t *testing.T) {
	srv := testenv.Redis(t)
	h := &contextLog{ids: make(map[string]string)}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(func(c *gin.Context) {
			c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), requestIDKey{}, c.GetHeader("X-Request-ID")))
		})
		r.POST("/slow/:id", g.Lock("slow:<id>", guard.LongHold(time.Millisecond)), func(c *gin.Context) {
			time.Sleep(5 * time.Millisecond)
			c.Status(http.StatusNoContent)
		})
	}, guard.WithLogger(slog.New(h)))
	if r := do(t, http.MethodPost, in.srv.URL+"/slow/1", "", "X-Request-ID", "req-42"); r.status != http.StatusNoContent {
		t.Fatalf("POST /slow/1: %d %s", r.status, r.body)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	found := false
	for msg, id := range h.ids {
		found = true
		if id != "req-42" {
			t.Errorf("log line %q written with request id %q, want the request's \"req-42\"", msg, id)
		}
	}
	if !found {
		t.Error("no log line for a hold longer than LongHold")
	}
}

// TestGuard_ARouteMismatchIsLoggedWithTheRequestContext: the first request
// on a route that a Lock template cannot apply to is logged with that
// request's context.
func TestGuard_ARouteMismatchIsLoggedWithTheRequestContext(t *testing.T) {
	srv := testenv.Redis(t)
	h := &contextLog{ids: make(map[string]string)}
	in := newInstance(t, srv, func(g *guard.Guard, r *gin.Engine) {
		r.Use(func(c *gin.Context) {
			c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), requestIDKey{}, c.GetHeader("X-Request-ID")))
		})
		r.POST("/orders", g.Lock("order:<path:id>"), func(c *gin.Context) { c.Status(http.StatusNoContent) })
	}, guard.WithLogger(slog.New(h)))
	if r := do(t, http.MethodPost, in.srv.URL+"/orders", "", "X-Request-ID", "req-7"); r.status != http.StatusInternalServerError {
		t.Fatalf("POST /orders: %d %s, want 500", r.status, r.body)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for msg, id := range h.ids {
		if strings.Contains(msg, "names a path parameter the route does not have") {
			if id != "req-7" {
				t.Errorf("log line %q written with request id %q, want the request's \"req-7\"", msg, id)
			}
			return
		}
	}
	t.Errorf("no log line for the route mismatch among %v", h.ids)
}

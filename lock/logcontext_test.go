package lock_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// requestIDKey is the context key a caller stores a request id under, as
// tracing and request-id middleware do.
type requestIDKey struct{}

// contextLog is a slog.Handler that records, for every record it handles,
// its message and the request id of the context it was handed.
type contextLog struct {
	mu   sync.Mutex
	seen []logged
}

type logged struct{ msg, id string }

func (h *contextLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *contextLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *contextLog) WithGroup(string) slog.Handler            { return h }
func (h *contextLog) Handle(ctx context.Context, r slog.Record) error {
	id, _ := ctx.Value(requestIDKey{}).(string)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, logged{r.Message, id})
	return nil
}

// find returns the first record whose message contains part.
func (h *contextLog) find(part string) (logged, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.seen {
		if strings.Contains(l.msg, part) {
			return l, true
		}
	}
	return logged{}, false
}

// TestLogger_ALostHoldIsLoggedWithTheContextItWasTakenWith: the watchdog
// finds a hold lost in the background, long after Lock returned; the log
// record about it is handed the context the hold was taken with, so a
// handler finds the request's ids there.
func TestLogger_ALostHoldIsLoggedWithTheContextItWasTakenWith(t *testing.T) {
	srv := testenv.Redis(t)
	h := &contextLog{}
	c := instances(t, srv, 1, lock.WithLogger(slog.New(h)), lock.WithWatchdogTimeout(300*time.Millisecond))[0]
	name := lockName(t)
	ctx, err := c.Mutex(name).Lock(context.WithValue(context.Background(), requestIDKey{}, "req-17"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Do("DEL", name)
	<-ctx.Done()
	if err := context.Cause(ctx); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("the hold's context ended with %v, want ErrLost", err)
	}
	l, ok := h.find("a hold was lost")
	if !ok {
		t.Fatalf("no record about the lost hold among %v", h.seen)
	}
	if l.id != "req-17" {
		t.Errorf("the record %q was handed a context with request id %q, want %q (the Lock's)", l.msg, l.id, "req-17")
	}
}

// TestLogger_EveryRecordIsWrittenWithAContext: the package's own sources
// call the logger only through slog's *Context forms, so that no record
// about a hold loses the context it was taken with (the test above checks
// one such record; this one, that no call slips back to the plain forms).
func TestLogger_EveryRecordIsWrittenWithAContext(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !plain[sel.Sel.Name] {
				return true
			}
			if recv, ok := sel.X.(*ast.SelectorExpr); ok && recv.Sel.Name == "logger" {
				t.Errorf("%s: logger.%s: use %sContext with the hold's or the call's context", fset.Position(call.Pos()), sel.Sel.Name, sel.Sel.Name)
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "slog" {
				t.Errorf("%s: slog.%s: use the Client's logger and %sContext", fset.Position(call.Pos()), sel.Sel.Name, sel.Sel.Name)
			}
			return true
		})
	}
}

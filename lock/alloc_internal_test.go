package lock

import (
	"context"
	"errors"
	"testing"
	"time"
)

type allocTestKey struct{}

// A release is sent on its hold's context without the cancellation, as
// context.WithoutCancel would give it: the values are there, the
// cancellation and its cause are not.
func TestHold_DetachedContextIsWithoutCancel(t *testing.T) {
	parent := context.WithValue(context.Background(), allocTestKey{}, "request")
	h := &hold{name: "x", hk: heldKey{key: "x"}, kind: (*Mutex)(nil)}
	h.begin(parent, time.Now())
	d := h.detach(h.ctx)
	if d != &h.detached {
		t.Fatalf("detach(h.ctx) = %v, want the hold's own detached context", d)
	}
	h.cancel(ErrReleased)
	if d.Err() != nil || d.Done() != nil || context.Cause(d) != nil {
		t.Fatalf("detached context: Err %v, Done %v, Cause %v; want none", d.Err(), d.Done(), context.Cause(d))
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached context has a deadline")
	}
	if d.Value(allocTestKey{}) != "request" || heldBy(d, h.hk) != h {
		t.Fatal("detached context lost the values of the hold's context")
	}
	if !errors.Is(context.Cause(h.ctx), ErrReleased) {
		t.Fatalf("hold context's cause %v", context.Cause(h.ctx))
	}
	if c, cancel := context.WithCancel(d); c.Err() != nil {
		t.Fatal("a context derived from the detached one is cancelled")
	} else {
		cancel()
	}
	other := context.WithValue(h.ctx, allocTestKey{}, "other")
	if d := h.detach(other); d == &h.detached || d.Value(allocTestKey{}) != "other" || d.Err() != nil {
		t.Fatal("detach of another context")
	}
}

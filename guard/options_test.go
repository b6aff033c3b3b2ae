package guard_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// registrationPanic runs register and returns what it panicked with, or nil.
func registrationPanic(register func()) (v any) {
	defer func() { v = recover() }()
	register()
	return nil
}

func TestOptions_InvalidValueIsAnErrorCarriedToRegistration(t *testing.T) {
	// Making an option never panics: the option carries its error ...
	var opts []guard.RouteOption
	if v := registrationPanic(func() {
		opts = []guard.RouteOption{guard.Wait(-time.Second), guard.Lease(0), guard.Busy(200, ""),
			guard.RetryAfter(0), guard.BodyLimit(0), guard.LongHold(-1), guard.RecordTTL(0),
			guard.MaxResponse(-1), guard.WaitForFirst(-1), guard.IdempotencyHeader(""), guard.Scope("<ctx:"),
			guard.IdempotencyKey("k:<")}
	}); v != nil {
		t.Fatalf("an option constructor panicked: %v", v)
	}
	// ... and the middleware it is given to refuses it where the route is
	// registered, with an error that names the option.
	srv := testenv.Redis(t)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	for i, o := range opts {
		v := registrationPanic(func() { g.Lock("x", o) })
		if i >= 6 {
			v = registrationPanic(func() { g.Idempotent(guard.Unscoped(), o) })
		}
		err, ok := v.(error)
		if !ok || !errors.Is(err, guard.ErrBadOption) {
			t.Errorf("option %d: registration panicked with %v, want an error matching ErrBadOption", i, v)
		}
	}
}

func TestOptions_IdempotencyOptionGivenToLockIsRefused(t *testing.T) {
	srv := testenv.Redis(t)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	for name, o := range map[string]guard.RouteOption{
		"RecordTTL":         guard.RecordTTL(time.Hour),
		"Scope":             guard.Scope("<ctx:user_id>"),
		"Unscoped":          guard.Unscoped(),
		"StoreServerErrors": guard.StoreServerErrors(),
		"ReplayHeaders":     guard.ReplayHeaders("Location"),
	} {
		v := registrationPanic(func() { g.Lock("sku:<id>", o) })
		err, _ := v.(error)
		if !errors.Is(err, guard.ErrBadOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("guard.Lock(t, guard.%s(...)) panicked with %v, want ErrBadOption naming %s", name, v, name)
		}
	}
	// And a lock option given to Idempotent.
	for name, o := range map[string]guard.RouteOption{"Wait": guard.Wait(time.Second), "Lease": guard.Lease(time.Second), "Busy": guard.Busy(503, "x"), "LongHold": guard.LongHold(time.Second)} {
		v := registrationPanic(func() { g.Idempotent(guard.Unscoped(), o) })
		err, _ := v.(error)
		if !errors.Is(err, guard.ErrBadOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("guard.Idempotent(guard.%s(...)) panicked with %v, want ErrBadOption naming %s", name, v, name)
		}
	}
	// Options both read, and defaults of either kind, are fine.
	g2 := guard.New(srv.Client(), guard.WithLogger(quiet), guard.WithDefaults(guard.RecordTTL(time.Hour), guard.Wait(time.Second)))
	defer g2.Close()
	if v := registrationPanic(func() {
		g2.Lock("x", guard.RetryAfter(time.Second), guard.FailOpen(), guard.BodyLimit(1<<10))
		g2.Idempotent(guard.Unscoped(), guard.RetryAfter(time.Second), guard.FailOpen(), guard.BodyLimit(1<<10))
	}); v != nil {
		t.Fatalf("shared options refused: %v", v)
	}
	if v := registrationPanic(func() { guard.New(srv.Client(), guard.WithDefaults(guard.Wait(-1))) }); v == nil {
		t.Fatal("New accepted an invalid default")
	}
}

func TestOptions_BodyLimitBeyondWhatCanBeBufferedIsRefused(t *testing.T) {
	srv := testenv.Redis(t)
	g := guard.New(srv.Client(), guard.WithLogger(quiet))
	defer g.Close()
	for _, n := range []int64{math.MaxInt64, guard.MaxBodyLimit + 1} {
		v := registrationPanic(func() { g.Lock("x", guard.BodyLimit(n)) })
		if err, _ := v.(error); !errors.Is(err, guard.ErrBadOption) {
			t.Errorf("BodyLimit(%d): registration panicked with %v, want ErrBadOption", n, v)
		}
	}
	if v := registrationPanic(func() { g.Lock("x", guard.BodyLimit(guard.MaxBodyLimit)) }); v != nil {
		t.Errorf("BodyLimit(MaxBodyLimit) refused: %v", fmt.Sprint(v))
	}
}

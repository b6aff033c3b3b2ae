package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/seckillguard/seckillguard/fencing"
)

func TestNext_TakesTheLargerOfCounterAndClock(t *testing.T) {
	cases := []struct {
		stored fencing.Token
		now    int64
		want   fencing.Token
	}{
		{0, 1_700_000_000_000_000, 1_700_000_000_000_000},
		{1_700_000_000_000_000, 1_700_000_000_000_000, 1_700_000_000_000_001},
		{1_800_000_000_000_000, 1_700_000_000_000_000, 1_800_000_000_000_001}, // clock behind: counter wins
		{5, 0, 6},
	}
	for _, c := range cases {
		if got := fencing.Next(c.stored, c.now); got != c.want {
			t.Errorf("Next(%d, %d) = %d, want %d", c.stored, c.now, got, c.want)
		}
	}
}

func TestFromContext_ReturnsInnermostToken(t *testing.T) {
	ctx := context.Background()
	if _, ok := fencing.FromContext(ctx); ok {
		t.Fatal("empty context reports a token")
	}
	ctx = fencing.WithToken(ctx, 7)
	inner := fencing.WithToken(ctx, 9)
	if tok, ok := fencing.FromContext(inner); !ok || tok != 9 {
		t.Fatalf("inner token = %d, %v; want 9, true", tok, ok)
	}
	if tok, ok := fencing.FromContext(ctx); !ok || tok != 7 {
		t.Fatalf("outer token = %d, %v; want 7, true", tok, ok)
	}
	if _, ok := fencing.FromContext(fencing.WithToken(context.Background(), 0)); ok {
		t.Fatal("zero token reported as valid")
	}
}

func TestStaleError_IsErrStaleAndNamesBothTokens(t *testing.T) {
	err := fmt.Errorf("save order: %w", fencing.Stale("products", "sku=sku-1", 10, 12))
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("errors.Is(%v, ErrStale) = false", err)
	}
	var se *fencing.StaleError
	if !errors.As(err, &se) || se.Token != 10 || se.Current != 12 {
		t.Fatalf("errors.As: %+v", se)
	}
	want := "save order: fencing: stale token 10 (current 12) writing products sku=sku-1"
	if err.Error() != want {
		t.Fatalf("message\n got %q\nwant %q", err.Error(), want)
	}
	cause := errors.New("lock lost")
	wrapped := &fencing.StaleError{Token: 3, Cause: cause}
	if !errors.Is(wrapped, cause) || !errors.Is(wrapped, fencing.ErrStale) {
		t.Fatal("StaleError with a cause must match both the cause and ErrStale")
	}
}

// frameworkContext answers string keys from its own map and nothing else,
// as a *gin.Context does with ContextWithFallback false.
type frameworkContext struct {
	context.Context
	keys map[string]any
}

func (c *frameworkContext) Value(key any) any {
	if s, ok := key.(string); ok {
		return c.keys[s]
	}
	return nil
}

func TestFromContext_FindsTheLockContextPublishedUnderContextKey(t *testing.T) {
	lockCtx, cancel := context.WithCancel(fencing.WithToken(context.Background(), 42))
	defer cancel()
	fw := &frameworkContext{Context: context.Background(), keys: map[string]any{fencing.ContextKey: lockCtx}}
	if tok, ok := fencing.FromContext(fw); !ok || tok != 42 {
		t.Fatalf("FromContext = %d, %v; want 42, true", tok, ok)
	}
	if fencing.Holder(fw) != lockCtx {
		t.Fatal("Holder is not the published lock context")
	}
	// A token of the context's own wins over a published one.
	own := fencing.WithToken(fw, 43)
	if tok, _ := fencing.FromContext(own); tok != 43 || fencing.Holder(own) != own {
		t.Fatalf("own token: FromContext = %d", tok)
	}
	// Nothing published, or something else under the key: no token.
	for _, ctx := range []context.Context{
		&frameworkContext{Context: context.Background()},
		&frameworkContext{Context: context.Background(), keys: map[string]any{fencing.ContextKey: "x"}},
		&frameworkContext{Context: context.Background(), keys: map[string]any{fencing.ContextKey: context.Background()}},
	} {
		if _, ok := fencing.FromContext(ctx); ok || fencing.Holder(ctx) != ctx {
			t.Fatalf("token found in %v", ctx)
		}
	}
}

func TestTokenContext_CarriesItsTokenAndTheRest(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancelCause(context.WithValue(fencing.WithToken(context.Background(), 7), key{}, "v"))
	tc := &fencing.TokenContext{Context: parent, Token: 9}
	if tok, ok := fencing.FromContext(tc); !ok || tok != 9 {
		t.Fatalf("FromContext = %d, %v; want 9, true", tok, ok)
	}
	if tc.Value(key{}) != "v" || fencing.Holder(tc) != tc {
		t.Fatal("a TokenContext hides its context's values")
	}
	if tok, ok := fencing.FromContext(fencing.WithToken(tc, 11)); !ok || tok != 11 {
		t.Fatalf("a token inside a TokenContext's = %d, %v; want 11, true", tok, ok)
	}
	child, stop := context.WithCancel(tc)
	defer stop()
	cause := errors.New("released")
	cancel(cause)
	if child.Err() == nil || context.Cause(tc) != cause || context.Cause(child) != cause {
		t.Fatalf("cancellation: child %v, causes %v, %v", child.Err(), context.Cause(tc), context.Cause(child))
	}
	if _, ok := fencing.FromContext(&fencing.TokenContext{Context: context.Background()}); ok {
		t.Fatal("zero token reported as valid")
	}
}

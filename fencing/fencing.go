// Package fencing carries fencing tokens from a lock to the storage it protects.
//
// A lock held across processes can be lost without its holder noticing in
// time: a stop-the-world pause longer than the lease, a failover that promotes
// a replica which never saw the lock, a lease shorter than the work. A fencing
// token makes such a loss harmless: every acquisition of a lock gets a token
// greater than all earlier tokens of that lock, the token travels with the
// holder's context, and the storage refuses a write whose token is older than
// the newest one it has already applied.
//
// The package has no dependencies beyond the standard library so that both
// the lock (which issues tokens) and the storage adapters (which enforce them)
// can share it.
package fencing

import (
	"context"
	"errors"
	"strconv"
)

// Token is a fencing token. Tokens of one lock strictly increase from one
// acquisition to the next; re-entering a lock keeps the token of the first
// acquisition. The zero Token means "no token".
type Token int64

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatInt(int64(t), 10) }

// Valid reports whether t is an issued token (greater than zero).
func (t Token) Valid() bool { return t > 0 }

// Next returns the token to issue after stored, given the issuing server's
// clock in microseconds since the Unix epoch: max(stored+1, nowMicros).
//
// It is the rule every lock of package lock applies when it issues a token
// (issue_token in lock/scripts/lib.lua, run inside Redis against its TIME;
// lock's TestToken_ScriptsApplyFencingNext checks each kind's script against
// Next). The scripts add two things on top: an acquisition reserves the next
// few tokens for the holders its Client hands the lock to (the counter is
// left at token+n-1), and a MultiLock or RedLock issues at least the largest
// token of its other parts.
//
// Taking the clock into account keeps tokens increasing across a failover: a
// promoted replica that missed the last increments starts again from its
// clock, which is ahead of every token issued before the failover unless the
// clocks are skewed by more than the failover took. A plain counter would go
// backwards there.
func Next(stored Token, nowMicros int64) Token {
	if n := stored + 1; n > Token(nowMicros) {
		return n
	}
	return Token(nowMicros)
}

type tokenKey struct{}

// WithToken returns a copy of ctx that carries t as its innermost token.
// Locks call it when they are acquired; tests and adapters may call it to
// replay a write under a given token.
func WithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, tokenKey{}, t)
}

// A TokenContext is a context that carries Token as its innermost token,
// as WithToken's does, for a caller that keeps it in a value of its own
// instead of allocating a new context: package lock keeps the one of a
// lock context in the hold it belongs to. Everything but the token comes
// from the embedded Context, cancellation included. Token must not change
// once the context is in use.
type TokenContext struct {
	context.Context
	Token Token
}

// Value returns c's token under the key FromContext reads, and the
// embedded context's value for any other key.
func (c *TokenContext) Value(key any) any {
	if key == (tokenKey{}) {
		return &c.Token
	}
	return c.Context.Value(key)
}

// String describes c as the context package describes its contexts.
func (c *TokenContext) String() string {
	name := "context"
	if s, ok := c.Context.(interface{ String() string }); ok {
		name = s.String()
	}
	return name + ".WithToken(" + c.Token.String() + ")"
}

// ownToken returns the token ctx carries itself (not one published under
// ContextKey), and whether it carries one.
func ownToken(ctx context.Context) (Token, bool) {
	switch t := ctx.Value(tokenKey{}).(type) {
	case Token:
		return t, true
	case *Token: // a TokenContext's
		return *t, true
	}
	return 0, false
}

// ContextKey is the key under which web middleware publishes the context of
// the lock it holds on a framework's own request context, for frameworks
// whose context does not hand out the values of the request's context.
// Gin's *gin.Context answers string keys from c.Keys whatever its
// ContextWithFallback says, so guard.Lock does c.Set(fencing.ContextKey,
// lockCtx), and FromContext(c) finds the token. A string, because the
// framework looks up only string keys there. (Give a database the request's
// own context, db.WithContext(c.Request.Context()), not c: see guard.Lock.)
const ContextKey = "seckillguard/fencing.lockContext"

// FromContext returns the token of the innermost lock held by ctx, and
// whether there is one. A ctx that carries no token of its own but a lock
// context under ContextKey (a *gin.Context inside guard.Lock) gives that
// context's token.
func FromContext(ctx context.Context) (Token, bool) {
	return fromContext(Holder(ctx))
}

func fromContext(ctx context.Context) (Token, bool) {
	if ctx == nil {
		return 0, false
	}
	t, ok := ownToken(ctx)
	return t, ok && t.Valid()
}

// Holder returns the context whose token FromContext(ctx) reports: ctx
// itself, or the lock context published under ContextKey when ctx carries
// no token of its own. Storage adapters watch it for the end of the hold:
// it is cancelled when the lock is lost, which a *gin.Context is not unless
// ContextWithFallback is set.
func Holder(ctx context.Context) context.Context {
	if ctx == nil {
		return nil
	}
	if _, ok := ownToken(ctx); ok {
		return ctx
	}
	if inner, ok := ctx.Value(ContextKey).(context.Context); ok && inner != nil {
		if _, ok := ownToken(inner); ok {
			return inner
		}
	}
	return ctx
}

// ErrStale is the errors.Is target of every rejection of a write whose token
// is older than the one the storage has already applied.
var ErrStale = errors.New("fencing: stale token")

// StaleError describes one rejected write. It matches ErrStale under errors.Is.
type StaleError struct {
	Resource string // what was written, e.g. a table name
	Key      string // which item of the resource, e.g. "sku=sku-1"; may be empty
	Token    Token  // the token the write carried
	Current  Token  // the newer token the storage holds; 0 when unknown
	Cause    error  // why the write was refused when it is not a token comparison; may be nil
}

// Error describes the rejected write.
func (e *StaleError) Error() string {
	msg := "fencing: stale token " + e.Token.String()
	if e.Current.Valid() {
		msg += " (current " + e.Current.String() + ")"
	}
	if e.Resource != "" {
		msg += " writing " + e.Resource
		if e.Key != "" {
			msg += " " + e.Key
		}
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Unwrap returns the cause, if any.
func (e *StaleError) Unwrap() error { return e.Cause }

// Stale returns a *StaleError for a write of resource/key under token that
// the storage refused because it already holds current.
func Stale(resource, key string, token, current Token) error {
	return &StaleError{Resource: resource, Key: key, Token: token, Current: current}
}

package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// counterTTL returns the PTTL of the token counter of name.
func counterTTL(t *testing.T, srv *testenv.RedisServer, name string) time.Duration {
	t.Helper()
	d, err := srv.Client().PTTL(context.Background(), "redisson_lock_token:{"+name+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Lock names made from requests leave nothing behind for long: after many
// made-up names, taken by every kind that issues tokens, each name's token
// counter has the idle expiry (24h by default; set to an eighth more, see
// TestToken_ACounterInUseLivesItsExpiryAfterEachToken).
func TestToken_EveryCounterOfMadeUpNamesHasAnIdleExpiry(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	bg := context.Background()
	var names []string
	take := func(what string, lock func(string) (func() error, error)) {
		for i := 0; i < 10; i++ {
			n := fmt.Sprintf("%s:%s:sku-%d", name, what, i)
			unlock, err := lock(n)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if err := unlock(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			names = append(names, n)
		}
	}
	take("mutex", func(n string) (func() error, error) {
		ctx, err := c.Mutex(n).Lock(bg)
		return func() error { return c.Mutex(n).Unlock(ctx) }, err
	})
	take("fair", func(n string) (func() error, error) {
		ctx, err := c.FairMutex(n).Lock(bg)
		return func() error { return c.FairMutex(n).Unlock(ctx) }, err
	})
	take("write", func(n string) (func() error, error) {
		ctx, err := c.RWMutex(n).Lock(bg)
		return func() error { return c.RWMutex(n).Unlock(ctx) }, err
	})
	take("multi", func(n string) (func() error, error) {
		ml := c.MultiLock(n, n+":b")
		ctx, err := ml.Lock(bg)
		names = append(names, n+":b")
		return func() error { return ml.Unlock(ctx) }, err
	})
	take("red", func(n string) (func() error, error) {
		r := lock.NewRedLock(n, c)
		ctx, err := r.Lock(bg)
		return func() error { return r.Unlock(ctx) }, err
	})
	for _, n := range names {
		if d := counterTTL(t, srv, n); d <= lock.DefaultTokenExpiry || d > lock.DefaultTokenExpiry*9/8 {
			t.Fatalf("token counter of %q: PTTL %v, want an idle expiry of %v", n, d, lock.DefaultTokenExpiry)
		}
	}
}

// WithTokenExpiry sets the idle expiry; 0 keeps counters forever, as Redisson
// does.
func TestToken_WithTokenExpirySetsTheCountersExpiry(t *testing.T) {
	srv := testenv.Redis(t)
	name := lockName(t)
	for _, tc := range []struct {
		expiry time.Duration
		ok     func(time.Duration) bool
	}{
		{2 * time.Hour, func(d time.Duration) bool { return d > 2*time.Hour-time.Second && d <= 2*time.Hour*9/8 }},
		{0, func(d time.Duration) bool { return d == -1*time.Millisecond || d == -1 }},
	} {
		c := instances(t, srv, 1, lock.WithTokenExpiry(tc.expiry))[0]
		n := fmt.Sprintf("%s:%v", name, tc.expiry)
		ctx, err := c.Mutex(n).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c.Mutex(n).Unlock(ctx)
		if d := counterTTL(t, srv, n); !tc.ok(d) {
			t.Fatalf("WithTokenExpiry(%v): counter PTTL %v", tc.expiry, d)
		}
	}
	c := lock.New(srv.Client(), lock.WithTokenExpiry(time.Second))
	if _, err := c.Mutex(name).Lock(context.Background()); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("WithTokenExpiry(1s) = %v, want ErrInvalid", err)
	}
}

// A counter lives at least its expiry after every token issued from it, for
// every kind, though most tokens keep the expiry as it is (KEEPTTL, cheaper
// for Redis): one whose stored token is from an earlier eighth of the
// expiry than the clock, or from none, gets it anew; so does one ahead of
// the clock.
func TestToken_ACounterInUseLivesItsExpiryAfterEachToken(t *testing.T) {
	srv := testenv.Redis(t)
	const expiry = time.Hour
	c := instances(t, srv, 1, lock.WithTokenExpiry(expiry))[0]
	name := lockName(t)
	bg := context.Background()
	rdb := srv.Client()
	now, err := rdb.Time(bg).Result()
	if err != nil {
		t.Fatal(err)
	}
	for kind, acquire := range tokenKinds(c) {
		for what, stored := range map[string]int64{
			"stored an eighth ago": now.Add(-expiry / 8).UnixMicro(),
			"stored hours ago":     now.Add(-3 * expiry).UnixMicro(),
			"ahead of the clock":   now.Add(expiry / 16).UnixMicro(),
			"not a token of ours":  7,
		} {
			n := fmt.Sprintf("%s:%s:%s", name, kind, what)
			// Its expiry was set long ago: it has a second left.
			srv.Do("SET", "redisson_lock_token:{"+n+"}", stored, "PX", 1000)
			if _, err := acquire(n); err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			if d := counterTTL(t, srv, n); d < expiry-time.Second || d > expiry*9/8 {
				t.Fatalf("%s, counter %s: PTTL %v after a token, want at least %v", kind, what, d, expiry)
			}
		}
	}
}

// Tokens follow the Redis clock, so a counter that expired (or was deleted)
// cannot make them go backwards: the next token is still larger than every
// token issued before.
func TestToken_AnExpiredCounterDoesNotMakeTokensGoBackwards(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	m := c.Mutex(name)
	counter := "redisson_lock_token:{" + name + "}"
	var last fencing.Token
	for i := 0; i < 5; i++ {
		ctx, err := m.Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := fencing.FromContext(ctx)
		if tok <= last {
			t.Fatalf("round %d: token %d after the counter expired, not above %d", i, tok, last)
		}
		last = tok
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			srv.Do("DEL", counter)
		} else {
			srv.Do("PEXPIRE", counter, 1)
			eventually(t, time.Second, "the counter expires", func() bool { return srv.Do("EXISTS", counter) == int64(0) })
		}
	}
}

// fencing.Next is the rule every kind's script applies when it issues a
// token: max(stored + 1, the server's clock in microseconds), with the
// counter ahead of the clock and behind it.
func TestToken_ScriptsApplyFencingNext(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	bg := context.Background()
	rdb := srv.Client()
	micros := func() int64 {
		now, err := rdb.Time(bg).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	for kind, acquire := range tokenKinds(c) {
		for _, stored := range []fencing.Token{5, 1 << 52} { // behind the clock, ahead of it
			n := fmt.Sprintf("%s:%s:%d", name, kind, stored)
			srv.Do("SET", "redisson_lock_token:{"+n+"}", int64(stored))
			before := micros()
			ctx, err := acquire(n)
			if err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
			after := micros()
			tok, _ := fencing.FromContext(ctx)
			if lo, hi := fencing.Next(stored, before), fencing.Next(stored, after); tok < lo || tok > hi {
				t.Fatalf("%s with counter %d: token %d, want fencing.Next between %d and %d", kind, stored, tok, lo, hi)
			}
		}
	}
}

// tokenKinds returns, by kind, a first acquisition through c of every kind
// that issues fencing tokens, on the lock name it is given.
func tokenKinds(c *lock.Client) map[string]func(name string) (context.Context, error) {
	bg := context.Background()
	return map[string]func(string) (context.Context, error){
		"Mutex":     func(n string) (context.Context, error) { return c.Mutex(n).Lock(bg) },
		"FairMutex": func(n string) (context.Context, error) { return c.FairMutex(n).Lock(bg) },
		"RWMutex":   func(n string) (context.Context, error) { return c.RWMutex(n).Lock(bg) },
		"MultiLock": func(n string) (context.Context, error) { return c.MultiLock(n).Lock(bg) },
		"RedLock":   func(n string) (context.Context, error) { return lock.NewRedLock(n, c).Lock(bg) },
	}
}

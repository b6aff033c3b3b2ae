package lock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// These tests pin the Redis layout Redisson uses, so that Java services on
// Redisson and Go services on this package exclude each other.

func TestInterop_LayoutIsRedissons(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := "order:1001"
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if typ := srv.Do("TYPE", name); typ != "hash" {
		t.Fatalf("lock key type %v, want hash", typ)
	}
	fields := srv.Do("HGETALL", name).(map[any]any)
	if len(fields) != 1 {
		t.Fatalf("lock hash %v, want one field", fields)
	}
	for f, v := range fields {
		id, owner, ok := strings.Cut(f.(string), ":")
		if !ok || id != c.ID() || strings.Trim(owner, "0123456789") != "" {
			t.Fatalf("field %q, want \"<clientUUID>:<decimal owner>\"", f)
		}
		if v != "1" {
			t.Fatalf("hold count %v, want 1", v)
		}
	}
	if pttl := srv.Do("PTTL", name).(int64); pttl <= 29000 || pttl > 30000 {
		t.Fatalf("PTTL %d, want the 30s watchdog timeout", pttl)
	}
	if tok := srv.Do("GET", "redisson_lock_token:{order:1001}"); tok == nil {
		t.Fatal("no token counter at redisson_lock_token:{order:1001}")
	}
	c.Mutex(name).Unlock(ctx)
	if n := srv.Do("EXISTS", name); n != int64(0) {
		t.Fatal("lock key left after the final unlock")
	}
}

func TestInterop_RedissonHoldKeepsUsOutAndItsUnlockWakesUs(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	// A Java service holds the lock the way Redisson writes it.
	srv.Do("HSET", name, "7c2f0a6e-0d3b-4f3e-9a55-3b1d2f9b8e11:57", 1)
	srv.Do("PEXPIRE", name, 30000)

	if _, err := c.Mutex(name).TryLock(context.Background(), 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("TryLock on a Redisson-held lock = %v, want ErrNotAcquired", err)
	}
	got := make(chan time.Time, 1)
	go func() {
		ctx, err := c.Mutex(name).Lock(context.Background())
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		c.Mutex(name).Unlock(ctx)
	}()
	time.Sleep(100 * time.Millisecond)
	// Redisson's unlock: delete the hash, publish 0 on its channel.
	unlocked := time.Now()
	srv.Do("DEL", name)
	srv.Do("PUBLISH", "redisson_lock__channel:{"+name+"}", "0")
	select {
	case at, ok := <-got:
		if !ok {
			t.FailNow()
		}
		if d := at.Sub(unlocked); d > 500*time.Millisecond { // a message, not the 30s lease
			t.Fatalf("woken %v after Redisson's unlock", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Redisson's unlock message did not wake the waiter")
	}
}

func TestInterop_OurUnlockWakesRedissonSubscribers(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := "{user}:order"
	ps := srv.Client().Subscribe(context.Background(), "redisson_lock__channel:{user}:order")
	defer ps.Close()
	if _, err := ps.Receive(context.Background()); err != nil { // subscription confirmed
		t.Fatal(err)
	}
	ctx, err := c.Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tok := srv.Do("EXISTS", "redisson_lock_token:{user}:order"); tok != int64(1) {
		t.Fatal("a hash-tagged name must keep its tag in derived keys")
	}
	if err := c.Mutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	msg, err := ps.ReceiveMessage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if msg.Payload != "0" {
		t.Fatalf("unlock message %q, want Redisson's \"0\"", msg.Payload)
	}
}

func TestInterop_NamespacePrefixesEveryKey(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithNamespace("shop"))[0]
	ctx, err := c.Mutex("sku:1").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Mutex("sku:1").Unlock(ctx)
	if n := srv.Do("EXISTS", "shop:sku:1", "redisson_lock_token:{shop:sku:1}"); n != int64(2) {
		t.Fatalf("namespaced keys exist: %v, want 2", n)
	}
}

func TestNamespace_KeyShowsTheFullNameAndBracesAreRefused(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithNamespace("shop"))[0]
	if got := c.Key("sku:1"); got != "shop:sku:1" {
		t.Fatalf("Key = %q, want shop:sku:1", got)
	}
	if got := c.Namespace(); got != "shop" {
		t.Fatalf("Namespace = %q, want shop", got)
	}
	plain := instances(t, srv, 1)[0]
	if got := plain.Key("sku:1"); got != "sku:1" {
		t.Fatalf("Key without a namespace = %q, want sku:1", got)
	}
	bad := lock.New(srv.Client(), lock.WithNamespace("{shop}"))
	defer bad.Close()
	if _, err := bad.Mutex("sku:1").TryLock(context.Background(), 0); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("a namespace with braces: %v, want ErrInvalid", err)
	}
}

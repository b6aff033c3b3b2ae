package lock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// Errors read `lock "<full Redis name>": <what>`: the namespace is in the
// name, and the package's "lock: " is said once.
func TestErrors_OneFormatWithTheFullName(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2, lock.WithNamespace("ns"))
	ctx := context.Background()
	held, err := cs[0].Mutex("sku:42").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Mutex("sku:42").Unlock(held)
	sem, err := cs[0].Semaphore("permits:1", 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cs[0].Semaphore("permits:1", 1).Release(sem)

	check := func(what string, err error, want string, sentinel error) {
		t.Helper()
		if err == nil || err.Error() != want || !errors.Is(err, sentinel) {
			t.Errorf("%s: %v, want %q matching %v", what, err, want, sentinel)
		}
	}
	_, err = cs[1].Mutex("sku:42").TryLock(ctx, 0)
	check("Mutex.TryLock of a held lock", err, `lock "ns:sku:42": not acquired`, lock.ErrNotAcquired)
	_, err = cs[1].FairMutex("sku:42").TryLock(ctx, 0)
	check("FairMutex.TryLock of a held lock", err, `lock "ns:sku:42": not acquired`, lock.ErrNotAcquired)
	_, err = cs[1].Semaphore("permits:1", 1).TryAcquire(ctx, 0)
	check("Semaphore.TryAcquire with no permit left", err, `lock "ns:permits:1": not acquired`, lock.ErrNotAcquired)
	_, err = cs[1].MultiLock("a", "sku:42").TryLock(ctx, 0)
	check("MultiLock.TryLock over a held lock", err, `lock "ns:a, ns:sku:42": not acquired`, lock.ErrNotAcquired)
	check("Mutex.Unlock of a foreign context", cs[1].Mutex("sku:42").Unlock(ctx), `lock "ns:sku:42": not held`, lock.ErrNotHeld)
	check("RWMutex.Unlock of a foreign context", cs[1].RWMutex("rw").Unlock(ctx), `lock "ns:rw": not held`, lock.ErrNotHeld)

	rctx, err := cs[1].RWMutex("rw").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs[1].RWMutex("rw").Lock(rctx)
	check("RWMutex.Lock under its read lock", err, `lock "ns:rw": read lock held; upgrade to the write lock would deadlock`, lock.ErrUpgrade)
	cs[1].RWMutex("rw").RUnlock(rctx)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = cs[1].Mutex("sku:42").Lock(cancelled)
	check("Lock with an ended context", err, `lock "ns:sku:42": context canceled`, context.Canceled)

	cs[1].Close()
	_, err = cs[1].Mutex("sku:42").TryLock(ctx, 0)
	check("TryLock of a closed Client", err, `lock "ns:sku:42": client closed`, lock.ErrClosed)

	// The sentinels themselves keep the package's name.
	for _, s := range []error{lock.ErrNotAcquired, lock.ErrNotHeld, lock.ErrLost, lock.ErrUnavailable, lock.ErrClosed, lock.ErrInvalid} {
		if !strings.HasPrefix(s.Error(), "lock: ") || strings.Contains(s.Error(), "lock: lock:") {
			t.Errorf("sentinel %q, want one %q in front", s, "lock: ")
		}
	}
}

// A Redis that cannot be reached is an outage: every kind's error matches
// ErrUnavailable with go-redis's error kept as its cause, never
// ErrNotAcquired; a caller tells it from contention with errors.Is.
func TestErrors_AnOutageMatchesErrUnavailableWithItsCause(t *testing.T) {
	srv := testenv.Redis(t)
	down := func(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 200 * time.Millisecond }
	c := lock.New(srv.Client(down), lock.WithNamespace("ns"))
	defer c.Close()
	other := testenv.Redis(t)
	c2 := lock.New(other.Client(down))
	defer c2.Close()
	c3 := lock.New(testenv.Redis(t).Client(down))
	defer c3.Close()
	ctx := context.Background()
	held, err := c.Mutex("held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	other.Kill()

	check := func(what string, err error) {
		t.Helper()
		var op *net.OpError
		if !errors.Is(err, lock.ErrUnavailable) || !errors.As(err, &op) || errors.Is(err, lock.ErrNotAcquired) {
			t.Errorf("%s with Redis down: %v, want an error matching ErrUnavailable and the *net.OpError, not ErrNotAcquired", what, err)
		}
		if err != nil && strings.Contains(err.Error(), "lock: lock:") {
			t.Errorf("%s: %q stutters", what, err)
		}
	}
	_, err = c.Mutex("sku:42").TryLock(ctx, time.Second)
	check("Mutex.TryLock", err)
	if err != nil && !strings.HasPrefix(err.Error(), `lock "ns:sku:42": redis unavailable: `) {
		t.Errorf("Mutex.TryLock with Redis down reads %q", err)
	}
	_, err = c.Mutex("sku:42").Lock(ctx)
	check("Mutex.Lock", err)
	_, err = c.FairMutex("sku:42").TryLock(ctx, time.Second)
	check("FairMutex.TryLock", err)
	_, err = c.RWMutex("sku:42").RLock(ctx)
	check("RWMutex.RLock", err)
	_, err = c.Semaphore("sku:42", 2).TryAcquire(ctx, time.Second)
	check("Semaphore.TryAcquire", err)
	_, err = c.MultiLock("a", "b").TryLock(ctx, time.Second)
	check("MultiLock.TryLock", err)
	_, err = c.Mutex("sku:42").IsLocked(ctx)
	check("Mutex.IsLocked", err)
	_, err = c.Mutex("sku:42").ForceUnlock(ctx)
	check("Mutex.ForceUnlock", err)
	check("Mutex.Unlock", c.Mutex("held").Unlock(held))
	// Two of three RedLock nodes down: no quorum, and an outage.
	_, err = lock.NewRedLock("red", c, c2, c3).TryLock(ctx, time.Second)
	check("RedLock.TryLock", err)
	if !errors.Is(err, lock.ErrNoQuorum) {
		t.Errorf("RedLock.TryLock with two of three nodes down: %v, want ErrNoQuorum too", err)
	}

	// A caller whose context ends meanwhile is told of its context, not
	// of the outage.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Mutex("sku:42").Lock(cancelled); !errors.Is(err, context.Canceled) || errors.Is(err, lock.ErrUnavailable) {
		t.Errorf("Lock with an ended context and Redis down: %v, want context.Canceled", err)
	}
}

// Client.Err says whether the Client can be used, without I/O.
func TestClient_ErrSaysWhyItCannotBeUsed(t *testing.T) {
	srv := testenv.Redis(t)
	c := lock.New(srv.Client())
	if err := c.Err(); err != nil {
		t.Fatalf("Err of a new Client = %v, want nil", err)
	}
	c.Close()
	if err := c.Err(); !errors.Is(err, lock.ErrClosed) {
		t.Errorf("Err of a closed Client = %v, want ErrClosed", err)
	}
	for what, bad := range map[string]*lock.Client{
		"no Redis client":         lock.New(nil),
		"a namespace with braces": lock.New(srv.Client(), lock.WithNamespace("a{b}")),
		"too short a watchdog":    lock.New(srv.Client(), lock.WithWatchdogTimeout(time.Millisecond)),
	} {
		if err := bad.Err(); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("Err of a Client made with %s = %v, want ErrInvalid", what, err)
		}
		bad.Close()
	}
	var none *lock.Client
	if err := none.Err(); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("Err of a nil Client = %v, want ErrInvalid", err)
	}
}

// A name whose keys hold another kind's data (a Semaphore's count of free
// permits under a Mutex, a Mutex's hash under a Semaphore) fails at the
// first call with an error that says so and matches ErrInvalid, never
// ErrNotAcquired and never an outage; Redis's WRONGTYPE reply is kept as
// its cause.
func TestErrors_ANameOfAnotherKindSaysSo(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1, lock.WithNamespace("ns"))[0]
	rdb := srv.Client()
	ctx := context.Background()
	rdb.HSet(ctx, "ns:counted", "someone:1", 1) // a Mutex's hash
	rdb.Set(ctx, "ns:permits", "2", 0)          // a Semaphore's free permits
	rdb.Set(ctx, "ns:plain", "x", 0)
	check := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s on a name of another kind succeeded", what)
		case !errors.Is(err, lock.ErrInvalid) || errors.Is(err, lock.ErrNotAcquired) || errors.Is(err, lock.ErrUnavailable):
			t.Errorf("%s on a name of another kind: %v, want an error matching ErrInvalid only", what, err)
		case !strings.Contains(err.Error(), "another type") || !strings.Contains(err.Error(), "WRONGTYPE"):
			t.Errorf("%s on a name of another kind reads %q: want it to say so, with Redis's reply", what, err)
		}
	}
	_, err := c.Semaphore("counted", 2).TryAcquire(ctx, 0)
	check("Semaphore.TryAcquire", err)
	_, err = c.Semaphore("counted", 2).Acquire(ctx)
	check("Semaphore.Acquire", err)
	_, err = c.Mutex("permits").TryLock(ctx, 0)
	check("Mutex.TryLock", err)
	_, err = c.Mutex("permits").Lock(ctx)
	check("Mutex.Lock", err)
	_, err = c.Semaphore("plain", 2).TryAcquire(ctx, 0)
	check("Semaphore.TryAcquire on a string", err)
	_, err = c.FairMutex("plain").TryLock(ctx, 0)
	check("FairMutex.TryLock", err)
	_, err = c.RWMutex("plain").RLock(ctx)
	check("RWMutex.RLock", err)
	_, err = c.RWMutex("plain").Lock(ctx)
	check("RWMutex.Lock", err)
	_, err = c.MultiLock("plain", "other").TryLock(ctx, 0)
	check("MultiLock.TryLock", err)
}

package lock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/redissonemu"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// javaField is the owner field of the Java service the tests play: a
// Redisson connection manager id and a thread id.
const javaField = "7c2f0a6e-0d3b-4f3e-9a55-3b1d2f9b8e11:57"

// redissonLock takes or re-enters name the way Redisson's RLock does (the
// protocol emulator), as thread 57 of a Java service, for 30 s.
func redissonLock(t *testing.T, rdb redis.UniversalClient, name string) {
	t.Helper()
	j := redissonemu.New(rdb, redissonemu.Config{ID: strings.TrimSuffix(javaField, ":57")})
	if err := j.Lock(name).LockLease(context.Background(), 57, 30*time.Second); err != nil {
		t.Fatalf("the Java service's lock: %v", err)
	}
}

// channel returns the subscribers of the inspected channel named name.
func channel(in *lock.Inspection, name string) int64 {
	for _, c := range in.Channels {
		if c.Name == name {
			return c.Subscribers
		}
	}
	return -1
}

// inspectUntil inspects name until cond holds or 10s pass.
func inspectUntil(t *testing.T, c *lock.Client, name, what string, cond func(*lock.Inspection) bool) *lock.Inspection {
	t.Helper()
	var in *lock.Inspection
	eventually(t, 10*time.Second, what, func() bool {
		var err error
		if in, err = c.Inspect(context.Background(), name); err != nil {
			t.Fatal(err)
		}
		return cond(in)
	})
	return in
}

// TestInspect_RedissonHoldShowsItsHoldCountAndWaiters is the stuck lock of
// a Java service: a thread took it twice and unlocked once. Inspect names
// the thread, its hold count 2, the lease left, and the Go Client waiting.
func TestInspect_RedissonHoldShowsItsHoldCountAndWaiters(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	rdb := srv.Client()
	defer rdb.Close()
	redissonLock(t, rdb, name)
	redissonLock(t, rdb, name)

	in, err := cs[0].Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held() || in.Kind != lock.KindMutex || len(in.Owners) != 1 {
		t.Fatalf("inspection %+v, want a mutex held by one owner", in)
	}
	o := in.Owners[0]
	if o.Field != javaField || o.ClientID != "7c2f0a6e-0d3b-4f3e-9a55-3b1d2f9b8e11" || o.OwnerID != "57" || o.Holds != 2 {
		t.Errorf("owner %+v, want thread 57 of the Java client holding twice", o)
	}
	if in.Lease <= 29*time.Second || in.Lease > 30*time.Second {
		t.Errorf("lease left %v, want just under Redisson's 30s", in.Lease)
	}
	if in.Token != 0 {
		t.Errorf("token %d: Redisson's RLock issues none", in.Token)
	}

	waited := make(chan error, 1)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, err := cs[1].Mutex(name).Lock(wctx)
		waited <- err
	}()
	unlockCh := "redisson_lock__channel:{" + name + "}"
	in = inspectUntil(t, cs[0], name, "the waiting Client's subscription", func(in *lock.Inspection) bool { return channel(in, unlockCh) == 1 })
	if !in.Held() || in.Owners[0].Holds != 2 {
		t.Errorf("while a Client waits: %+v", in)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("the waiter: %v", err)
	}
}

// TestInspect_EveryKindShowsHoldersAndLines inspects each kind of this
// package while it is held and waited for.
func TestInspect_EveryKindShowsHoldersAndLines(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	bg := context.Background()
	base := lockName(t)

	t.Run("FreeName", func(t *testing.T) {
		in, err := cs[0].Inspect(bg, base+":free")
		if err != nil {
			t.Fatal(err)
		}
		if in.Held() || in.Kind != lock.KindNone || in.Lease != 0 || len(in.Queue) != 0 {
			t.Errorf("a free name: %+v", in)
		}
	})

	t.Run("NotALock", func(t *testing.T) {
		srv.Do("SET", base+":string", "x")
		if _, err := cs[0].Inspect(bg, base+":string"); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("a string key: err = %v, want ErrInvalid", err)
		}
	})

	t.Run("ReentrantMutex", func(t *testing.T) {
		name := base + ":mutex"
		m := cs[0].Mutex(name)
		ctx, err := m.Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		if ctx, err = m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		in, err := cs[1].Inspect(bg, name)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := fencing.FromContext(ctx)
		if len(in.Owners) != 1 || in.Owners[0].ClientID != cs[0].ID() || in.Owners[0].Holds != 2 {
			t.Errorf("owners %+v, want Client %s holding twice", in.Owners, cs[0].ID())
		}
		if in.Token < int64(tok) || in.TokenTTL == 0 {
			t.Errorf("token counter %d (ttl %v), want at least the hold's token %d", in.Token, in.TokenTTL, tok)
		}
		m.Unlock(ctx)
		m.Unlock(ctx)
	})

	t.Run("FairLine", func(t *testing.T) {
		name := base + ":fair"
		held, err := cs[0].FairMutex(name).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(bg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			cs[1].FairMutex(name).Lock(wctx)
		}()
		in := inspectUntil(t, cs[0], name, "the fair waiter in line and subscribed", func(in *lock.Inspection) bool {
			return len(in.Queue) == 1 && channel(in, "redisson_lock__channel:{"+name+"}:"+in.Queue[0].Field) == 1
		})
		if w := in.Queue[0]; w.ClientID != cs[1].ID() || w.Expires <= 0 || in.QueueLen != 1 {
			t.Errorf("fair line %+v (%d), want Client %s with time left", in.Queue, in.QueueLen, cs[1].ID())
		}
		cancel()
		<-done
		cs[0].FairMutex(name).Unlock(held)
	})

	t.Run("ReadersAndAWaitingWriter", func(t *testing.T) {
		name := base + ":rw"
		r1, err := cs[0].RWMutex(name).RLock(bg)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := cs[1].RWMutex(name).RLock(bg)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(bg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			cs[0].RWMutex(name).Lock(wctx)
		}()
		in := inspectUntil(t, cs[1], name, "the writer waiting", func(in *lock.Inspection) bool { return in.WritersLen == 1 })
		if in.Kind != lock.KindRWMutex || in.Mode != "read" || len(in.Owners) != 2 {
			t.Fatalf("inspection %+v, want two readers of an RWMutex in read mode", in)
		}
		for _, o := range in.Owners {
			if o.Write || o.Holds != 1 || o.Lease <= 0 {
				t.Errorf("reader %+v, want one read hold with a lease of its own", o)
			}
		}
		if w := in.Writers[0]; w.ClientID != cs[0].ID() || w.Expires <= 0 {
			t.Errorf("waiting writer %+v", w)
		}
		cancel()
		<-done
		cs[0].RWMutex(name).RUnlock(r1)
		cs[1].RWMutex(name).RUnlock(r2)

		w, err := cs[0].RWMutex(name).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		in, err = cs[1].Inspect(bg, name)
		if err != nil {
			t.Fatal(err)
		}
		if in.Mode != "write" || len(in.Owners) != 1 || !in.Owners[0].Write || in.Owners[0].ClientID != cs[0].ID() {
			t.Errorf("write-held: %+v", in)
		}
		cs[0].RWMutex(name).Unlock(w)
	})

	t.Run("SemaphorePermits", func(t *testing.T) {
		name := base + ":sem"
		p1, err := cs[0].Semaphore(name, 3).Acquire(bg)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := cs[1].Semaphore(name, 3).Acquire(bg)
		if err != nil {
			t.Fatal(err)
		}
		in, err := cs[0].Inspect(bg, name)
		if err != nil {
			t.Fatal(err)
		}
		if in.Kind != lock.KindSemaphore || len(in.Owners) != 2 {
			t.Fatalf("inspection %+v, want a semaphore with two holders", in)
		}
		ids := []string{in.Owners[0].ClientID, in.Owners[1].ClientID}
		if !slices.Contains(ids, cs[0].ID()) || !slices.Contains(ids, cs[1].ID()) || in.Owners[0].Lease <= 0 {
			t.Errorf("holders %+v, want both Clients with leases", in.Owners)
		}
		cs[0].Semaphore(name, 3).Release(p1)
		cs[1].Semaphore(name, 3).Release(p2)
	})

	t.Run("ScanListsLocksNotTheirDerivedKeys", func(t *testing.T) {
		names := []string{base + ":scan:a", base + ":scan:b"}
		var ctxs []context.Context
		for _, n := range names {
			ctx, err := cs[0].Mutex(n).Lock(bg)
			if err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, ctx)
		}
		got, err := cs[1].Scan(bg, "*"+base+":scan:*", 10)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, names) {
			t.Errorf("Scan = %q, want %q (the token counters left out)", got, names)
		}
		if got, _ := cs[1].Scan(bg, "*"+base+":scan:*", 1); len(got) != 1 {
			t.Errorf("Scan with limit 1 = %q", got)
		}
		for i, n := range names {
			cs[0].Mutex(n).Unlock(ctxs[i])
		}
	})
}

// TestInspect_WorksOnClusterAndSentinel: the same answers through a Cluster
// client (sharded channels counted on the slot's master) and a Sentinel
// failover client.
func TestInspect_WorksOnClusterAndSentinel(t *testing.T) {
	bg := context.Background()
	check := func(t *testing.T, holder, waiter, inspector *lock.Client, name string) {
		t.Helper()
		ctx, err := holder.Mutex(name).Lock(bg)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(bg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			waiter.Mutex(name).Lock(wctx)
		}()
		unlockCh := "redisson_lock__channel:{" + name + "}"
		in := inspectUntil(t, inspector, name, "the waiter's subscription", func(in *lock.Inspection) bool { return channel(in, unlockCh) == 1 })
		if len(in.Owners) != 1 || in.Owners[0].ClientID != holder.ID() || in.Owners[0].Holds != 1 || in.Token <= 0 || in.Lease <= 0 {
			t.Errorf("inspection %+v", in)
		}
		cancel()
		<-done
		holder.Mutex(name).Unlock(ctx)
	}

	t.Run("Cluster", func(t *testing.T) {
		env := testenv.Cluster(t, 3)
		var cs []*lock.Client
		for range 3 {
			c := lock.New(env.Client())
			t.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		for _, name := range namesOnEveryMaster(t, env.Client(), lockName(t), 3) {
			check(t, cs[0], cs[1], cs[2], name)
		}
		got, err := cs[2].Scan(bg, "nothing-here:*", 5)
		if err != nil || len(got) != 0 {
			t.Errorf("Scan on a Cluster = %q, %v", got, err)
		}
	})

	t.Run("Sentinel", func(t *testing.T) {
		env := testenv.Sentinel(t)
		var cs []*lock.Client
		for range 3 {
			c := lock.New(env.FailoverClient())
			t.Cleanup(func() { c.Close() })
			cs = append(cs, c)
		}
		check(t, cs[0], cs[1], cs[2], lockName(t))
	})
}

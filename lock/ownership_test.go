package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// fanOut runs f in n goroutines at once and waits for them.
func fanOut(n int, f func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(i)
		}()
	}
	close(start)
	wg.Wait()
}

// Goroutines fanned out from a request that holds lock X share X's context,
// but not a hold of another lock: each of them taking Mutex("inner") is an
// acquisition of its own, and they exclude each other.
func TestOwnership_FannedOutGoroutinesExcludeEachOtherOnAnInnerMutex(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	req, err := c.Mutex(name + ":outer").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	inner := c.Mutex(name + ":inner")
	var inside, most atomic.Int32
	var tokens sync.Map
	fanOut(4, func(i int) {
		ctx, err := inner.TryLock(req, 5*time.Second)
		if err != nil {
			t.Error(err)
			return
		}
		if n := inside.Add(1); n > most.Load() {
			most.Store(n)
		}
		tok, _ := fencing.FromContext(ctx)
		if _, dup := tokens.LoadOrStore(tok, i); dup {
			t.Errorf("goroutine %d got token %d a second time", i, tok)
		}
		time.Sleep(20 * time.Millisecond)
		inside.Add(-1)
		if err := inner.Unlock(ctx); err != nil {
			t.Error(err)
		}
	})
	if n := most.Load(); n != 1 {
		t.Fatalf("%d goroutines of one request held the inner Mutex at once, want 1", n)
	}
	if err := c.Mutex(name + ":outer").Unlock(req); err != nil {
		t.Fatal(err)
	}
}

// A Semaphore of one permit admits one holder, whoever shares a request
// context with whom.
func TestOwnership_SemaphoreOfOnePermitAdmitsOneGoroutineOfARequest(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	req, err := c.Mutex(name + ":request").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := c.Semaphore(name, 1)
	var admitted atomic.Int32
	fanOut(4, func(int) {
		if _, err := s.TryAcquire(req, 0); err == nil {
			admitted.Add(1)
		} else if !errors.Is(err, lock.ErrNotAcquired) {
			t.Error(err)
		}
	})
	if n := admitted.Load(); n != 1 {
		t.Fatalf("a Semaphore of 1 permit admitted %d goroutines of one request, want 1", n)
	}
	if n := srv.Do("ZCARD", permitsKey(name)); n != int64(1) {
		t.Fatalf("%v permits in Redis, want 1", n)
	}
}

// While one goroutine waits for a lock, another goroutine's TryLock of the
// same lock with the same context gives up after its own wait: it does not
// queue behind the first goroutine's hold in the making.
func TestOwnership_TryLockIsNotBlockedBehindAnotherGoroutinesWait(t *testing.T) {
	srv := testenv.Redis(t)
	cs := instances(t, srv, 2)
	name := lockName(t)
	held, err := cs[1].Mutex(name).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req, err := cs[0].Mutex(name + ":request").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := cs[0].Mutex(name)
	waiting := make(chan error, 1)
	go func() {
		ctx, err := m.TryLock(req, 10*time.Second)
		if err == nil {
			err = m.Unlock(ctx)
		}
		waiting <- err
	}()
	channel := "redisson_lock__channel:{" + name + "}"
	eventually(t, 2*time.Second, "the first goroutine waits on the unlock channel", func() bool {
		n, _ := srv.Client().PubSubNumSub(context.Background(), channel).Result()
		return n[channel] >= 1
	})
	start := time.Now()
	second := make(chan error, 1)
	go func() {
		ctx, err := m.TryLock(req, 100*time.Millisecond)
		if err == nil {
			err = errors.Join(errors.New("acquired a held lock"), m.Unlock(ctx))
		}
		second <- err
	}()
	got := false
	select {
	case err := <-second:
		got = true
		if d := time.Since(start); d > time.Second {
			t.Errorf("TryLock(100ms) returned after %v", d)
		}
		if !errors.Is(err, lock.ErrNotAcquired) {
			t.Errorf("TryLock of a held lock = %v, want ErrNotAcquired", err)
		}
	case <-time.After(3 * time.Second):
		t.Errorf("TryLock(100ms) still waiting after 3s: it waits behind the other goroutine's wait")
	}
	if err := cs[1].Mutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	if !got {
		<-second
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
}

// The owner field of each acquisition is Redisson's "<clientUUID>:<ownerID>"
// with an owner id of its own: two acquisitions made with one request
// context never share a field.
func TestOwnership_EachAcquisitionHasAnOwnerFieldOfItsOwn(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	req, err := c.Mutex(name + ":request").Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fields := make(map[string]bool)
	for i := 0; i < 3; i++ {
		m := c.Mutex(fmt.Sprintf("%s:%d", name, i))
		ctx, err := m.Lock(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := srv.Client().HKeys(context.Background(), fmt.Sprintf("%s:%d", name, i)).Result()
		if len(got) != 1 || !strings.HasPrefix(got[0], c.ID()+":") || strings.Trim(strings.TrimPrefix(got[0], c.ID()+":"), "0123456789") != "" {
			t.Fatalf("fields %q, want one \"<clientUUID>:<decimal owner>\"", got)
		}
		if fields[got[0]] {
			t.Fatalf("field %q used by two acquisitions", got[0])
		}
		fields[got[0]] = true
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rf, _ := srv.Client().HKeys(context.Background(), name+":request").Result()
	if fields[rf[0]] {
		t.Fatalf("an inner lock shares the request lock's field %q", rf[0])
	}
}

// A context re-enters the locks it descends from, whichever kind took them:
// a Mutex under a MultiLock of its name, a MultiLock under a Mutex of one of
// its names, and the write lock under its own read-down-grade only through
// the write lock's context.
func TestOwnership_ReentryFollowsTheAcquisitionAcrossKinds(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	bg := context.Background()
	a, b := c.Mutex(name+":a"), c.Mutex(name+":b")
	ml := c.MultiLock(name+":a", name+":b")

	// A Mutex under the MultiLock's context re-enters it.
	mctx, err := ml.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	actx, err := a.TryLock(mctx, 0)
	if err != nil {
		t.Fatalf("Mutex under its MultiLock: %v", err)
	}
	if n, _ := a.HoldCount(actx); n != 2 {
		t.Fatalf("hold count of a under the MultiLock = %d, want 2", n)
	}
	if err := a.Unlock(actx); err != nil {
		t.Fatal(err)
	}
	// A context that only shares the MultiLock's parent does not.
	if _, err := b.TryLock(bg, 0); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Mutex with an unrelated context = %v, want ErrNotAcquired", err)
	}
	if err := ml.Unlock(mctx); err != nil {
		t.Fatal(err)
	}

	// A MultiLock under a Mutex of one of its names re-enters that one.
	actx, err = a.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	mctx, err = ml.TryLock(actx, 0)
	if err != nil {
		t.Fatalf("MultiLock under a Mutex of its name: %v", err)
	}
	if n, _ := a.HoldCount(mctx); n != 2 {
		t.Fatalf("hold count of a = %d, want 2", n)
	}
	if err := ml.Unlock(mctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.HoldCount(actx); n != 1 {
		t.Fatalf("hold count of a after the MultiLock = %d, want 1", n)
	}
	if err := a.Unlock(actx); err != nil {
		t.Fatal(err)
	}

	// RWMutex: the write lock's context downgrades; the read hold's context
	// cannot upgrade, and does not carry the write lock.
	rw := c.RWMutex(name + ":rw")
	wctx, err := rw.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, err := rw.TryRLock(wctx, 0)
	if err != nil {
		t.Fatalf("downgrade: %v", err)
	}
	if _, err := rw.TryLock(rctx, 0); !errors.Is(err, lock.ErrUpgrade) {
		t.Fatalf("write lock from the read hold's context = %v, want ErrUpgrade", err)
	}
	w2, err := rw.TryLock(wctx, 0)
	if err != nil {
		t.Fatalf("write re-entry: %v", err)
	}
	if err := rw.Unlock(w2); err != nil {
		t.Fatal(err)
	}
	if err := rw.Unlock(rctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("write unlock with the read hold's context = %v, want ErrNotHeld", err)
	}
	if err := rw.Unlock(wctx); err != nil {
		t.Fatal(err)
	}
	// Another reader of the same request gets in beside the downgraded one.
	r2, err := rw.TryRLock(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctx := range []context.Context{r2, rctx} {
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.Do("EXISTS", name+":rw"); n != int64(0) {
		t.Fatal("the RWMutex is still held after every release")
	}
}

// fencing.FromContext answers the innermost lock's token, re-entries
// included.
func TestOwnership_FencingTokenIsTheInnermostLocks(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	x, y := c.Mutex(name+":x"), c.Mutex(name+":y")
	cx, err := x.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cy, err := y.Lock(cx)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := fencing.FromContext(cx)
	ty, _ := fencing.FromContext(cy)
	if tx == ty || !ty.Valid() {
		t.Fatalf("tokens x %d, y %d: want two valid tokens", tx, ty)
	}
	sctx, err := c.Semaphore(name+":s", 2).Acquire(cy)
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := fencing.FromContext(sctx); tok != ty {
		t.Fatalf("token under a permit = %d, want y's %d", tok, ty)
	}
	cx2, err := x.Lock(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if tok, _ := fencing.FromContext(cx2); tok != tx {
		t.Fatalf("token of x re-entered under y = %d, want x's %d", tok, tx)
	}
}

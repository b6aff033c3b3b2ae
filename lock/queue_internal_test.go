package lock

import (
	"context"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// localWaiters returns how many goroutines of c wait for a lock.
func localWaiters(c *Client) int {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	n := 0
	for _, q := range c.queues {
		n += len(q.waiters)
	}
	return n
}

// untilTrue polls cond until it holds or d passes.
func untilTrue(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A writer that queues in its Client behind a reader of the same lock still
// takes its place in the writers' line at once: a stream of readers of other
// Clients that arrive after it must not keep it waiting.
func TestRWMutex_WriterQueuedBehindALocalReaderKeepsLaterReadersOut(t *testing.T) {
	srv := testenv.Redis(t)
	remote, local, first := New(srv.Client()), New(srv.Client()), New(srv.Client())
	for _, c := range []*Client{remote, local, first} {
		defer c.Close()
	}
	name := "internal:" + t.Name()
	bg := context.Background()
	held, err := first.RWMutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	readerDone := make(chan error, 1)
	go func() {
		r, err := local.RWMutex(name).RLock(bg)
		if err == nil {
			time.Sleep(100 * time.Millisecond) // a read among the others
			err = local.RWMutex(name).RUnlock(r)
		}
		readerDone <- err
	}()
	untilTrue(t, 5*time.Second, "local reader waiting", func() bool { return localWaiters(local) == 1 })
	type result struct {
		waited time.Duration
		err    error
	}
	writerDone := make(chan result, 1)
	start := time.Now()
	go func() {
		w, err := local.RWMutex(name).TryLock(bg, 5*time.Second)
		waited := time.Since(start)
		if err == nil {
			err = local.RWMutex(name).Unlock(w)
		}
		writerDone <- result{waited, err}
	}()
	untilTrue(t, 5*time.Second, "local writer waiting", func() bool { return localWaiters(local) == 2 })

	// Readers of another Client arrive after the writer, in a chain: each
	// new read hold is taken before the one before it is released, so the
	// lock is never free of readers unless a new reader is refused.
	stop, streamDone := make(chan struct{}), make(chan error, 1)
	go func() {
		rw := remote.RWMutex(name)
		cur, err := rw.RLock(bg)
		for err == nil {
			select {
			case <-stop:
				streamDone <- rw.RUnlock(cur)
				return
			case <-time.After(20 * time.Millisecond):
			}
			next, terr := rw.TryRLock(bg, 0)
			if err = rw.RUnlock(cur); err != nil {
				break
			}
			if terr != nil { // refused: wait behind the writer
				next, err = rw.RLock(bg)
			}
			cur = next
		}
		streamDone <- err
	}()
	if err := first.RWMutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	res := <-writerDone
	close(stop)
	if err := <-streamDone; err != nil {
		t.Fatal(err)
	}
	if err := <-readerDone; err != nil {
		t.Fatal(err)
	}
	if res.err != nil {
		t.Fatalf("writer queued behind a local reader: %v after %v", res.err, res.waited)
	}
	t.Logf("writer waited %v", res.waited)
	if res.waited > 2*time.Second {
		t.Fatalf("writer waited %v: readers that came after it kept getting in", res.waited)
	}
}

// A writer queued in its Client behind another writer takes its place in the
// writers' line as soon as the one before it holds the lock, so that a reader
// arriving after it cannot take the lock when that one unlocks.
func TestRWMutex_WriterQueuedBehindALocalWriterEnlistsWhenItBecomesHead(t *testing.T) {
	srv := testenv.Redis(t)
	remote, local, first := New(srv.Client()), New(srv.Client()), New(srv.Client())
	for _, c := range []*Client{remote, local, first} {
		defer c.Close()
	}
	name := "internal:" + t.Name()
	writers := derived(writersPrefix, name)
	bg := context.Background()
	held, err := first.RWMutex(name).Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		who string
		at  time.Time
		err error
	}
	grants := make(chan grant, 3)
	release1 := make(chan struct{})
	write := func(who string, hold <-chan struct{}) {
		w, err := local.RWMutex(name).TryLock(bg, 5*time.Second)
		grants <- grant{who, time.Now(), err}
		if err == nil {
			<-hold
			local.RWMutex(name).Unlock(w)
		}
	}
	go write("w1", release1)
	untilTrue(t, 5*time.Second, "w1 waiting", func() bool { return localWaiters(local) == 1 })
	now := make(chan struct{})
	close(now)
	go write("w2", now)
	untilTrue(t, 5*time.Second, "w2 waiting", func() bool { return localWaiters(local) == 2 })
	if err := first.RWMutex(name).Unlock(held); err != nil {
		t.Fatal(err)
	}
	if g := <-grants; g.who != "w1" || g.err != nil {
		t.Fatalf("first grant: %s %v", g.who, g.err)
	}
	untilTrue(t, 2*time.Second, "w2 in the writers' line while w1 holds", func() bool {
		return srv.Do("ZCARD", writers) == int64(1)
	})
	go func() {
		r, err := remote.RWMutex(name).TryRLock(bg, 5*time.Second)
		grants <- grant{"reader", time.Now(), err}
		if err == nil {
			remote.RWMutex(name).RUnlock(r)
		}
	}()
	untilTrue(t, 5*time.Second, "reader waiting", func() bool { return localWaiters(remote) == 1 })
	close(release1)
	for _, want := range []string{"w2", "reader"} {
		if g := <-grants; g.who != want || g.err != nil {
			t.Fatalf("grant to %s (%v), want %s", g.who, g.err, want)
		}
	}
}

// A lock handed over to a waiter while it waits for its unlock channel's
// subscription is the waiter's, even when its wait runs out before the
// subscription is confirmed: as when the wait runs out anywhere else, the
// handover counts and the waiter holds.
func TestMutex_HandoverDuringTheSubscriptionWaitIsKeptAtTheDeadline(t *testing.T) {
	srv := testenv.Redis(t)
	c := New(srv.Client())
	defer c.Close()
	bg := context.Background()
	m := c.Mutex("internal:" + t.Name())
	held, err := m.Lock(bg)
	if err != nil {
		t.Fatal(err)
	}
	// The unlock channel's SUBSCRIBE is never confirmed: the waiter that
	// becomes head stays in awaitSubscription until its wait runs out.
	c.subs.mu.Lock()
	c.subs.chans[m.unlockCh] = &chanSub{channel: m.unlockCh, ready: make(chan struct{})}
	c.subs.mu.Unlock()
	type result struct {
		ctx context.Context
		err error
	}
	got := make(chan result, 1)
	go func() {
		ctx, err := m.TryLock(bg, 300*time.Millisecond)
		got <- result{ctx, err}
	}()
	untilTrue(t, 5*time.Second, "waiter queued", func() bool { return localWaiters(c) == 1 })
	if err := m.Unlock(held); err != nil { // hands the lock over to the waiter
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		locked, _ := m.IsLocked(bg)
		t.Fatalf("TryLock after a handover to it = %v (lock still held in Redis: %v), want the lock", r.err, locked)
	}
	if n, _ := m.HoldCount(r.ctx); n != 1 {
		t.Fatalf("hold count %d after the handover, want 1", n)
	}
	if err := m.Unlock(r.ctx); err != nil {
		t.Fatal(err)
	}
}

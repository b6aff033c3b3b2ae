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

func TestReplicas_AcquisitionWaitsForReplicasAndIsUndoneWithFewer(t *testing.T) {
	master := testenv.Redis(t)
	replica := testenv.Replica(t, master)
	c := instances(t, master, 1)[0]
	name := lockName(t)
	bg := context.Background()

	ctx, err := c.Mutex(name).Lock(bg, lock.WithReplicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if replica.Do("EXISTS", name) != int64(1) {
		t.Fatal("acknowledged acquisition not on the replica when Lock returned")
	}
	if err := c.Mutex(name).Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, err = c.Mutex(name).Lock(bg, lock.WithReplicas(2, 150*time.Millisecond))
	if !errors.Is(err, lock.ErrNotReplicated) || errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("Lock asking 2 replicas of 1 = %v, want ErrNotReplicated", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("gave up after %v, want about the 150ms timeout", d)
	}
	if master.Do("EXISTS", name) != int64(0) {
		t.Fatal("an unconfirmed acquisition was left held")
	}
}

func TestReplicas_ClientDefaultCoversEveryKind(t *testing.T) {
	master := testenv.Redis(t)
	replica := testenv.Replica(t, master)
	c := instances(t, master, 1, lock.WithReplicaAck(1, 150*time.Millisecond))[0]
	base := lockName(t)
	bg := context.Background()
	kinds := map[string]func(opts ...lock.LockOption) error{
		"Mutex": func(opts ...lock.LockOption) error {
			ctx, err := c.Mutex(base+":m").TryLock(bg, 0, opts...)
			if err == nil {
				err = c.Mutex(base + ":m").Unlock(ctx)
			}
			return err
		},
		"FairMutex": func(opts ...lock.LockOption) error {
			ctx, err := c.FairMutex(base+":f").TryLock(bg, 0, opts...)
			if err == nil {
				err = c.FairMutex(base + ":f").Unlock(ctx)
			}
			return err
		},
		"RWMutex.Lock": func(opts ...lock.LockOption) error {
			ctx, err := c.RWMutex(base+":rw").TryLock(bg, 0, opts...)
			if err == nil {
				err = c.RWMutex(base + ":rw").Unlock(ctx)
			}
			return err
		},
		"RWMutex.RLock": func(opts ...lock.LockOption) error {
			ctx, err := c.RWMutex(base+":rw").TryRLock(bg, 0, opts...)
			if err == nil {
				err = c.RWMutex(base + ":rw").RUnlock(ctx)
			}
			return err
		},
		"Semaphore": func(opts ...lock.LockOption) error {
			ctx, err := c.Semaphore(base+":s", 2).TryAcquire(bg, 0, opts...)
			if err == nil {
				err = c.Semaphore(base+":s", 2).Release(ctx)
			}
			return err
		},
		"MultiLock": func(opts ...lock.LockOption) error {
			ml := c.MultiLock(base+":a", base+":b")
			ctx, err := ml.TryLock(bg, 0, opts...)
			if err == nil {
				err = ml.Unlock(ctx)
			}
			return err
		},
	}
	for name, f := range kinds {
		if err := f(); err != nil {
			t.Fatalf("%s with a live replica: %v", name, err)
		}
	}
	replica.Pause()
	for name, f := range kinds {
		if err := f(); !errors.Is(err, lock.ErrNotReplicated) {
			replica.Resume()
			t.Fatalf("%s with the replica paused = %v, want ErrNotReplicated", name, err)
		}
		// WithReplicas(0, 0) turns the Client's default off for one acquisition.
		if err := f(lock.WithReplicas(0, 0)); err != nil {
			replica.Resume()
			t.Fatalf("%s without acknowledgement: %v", name, err)
		}
	}
	replica.Resume()
	for _, k := range master.Do("KEYS", "*").([]any) {
		switch {
		case strings.HasPrefix(k.(string), "redisson_lock_token:"): // token counters stay by design
		case k == base+":s" && master.Do("GET", k) == "2": // so does a semaphore's count, every permit free
		case strings.HasSuffix(k.(string), ":seckillguard_freed") && master.Do("PTTL", k).(int64) <= 10:
			// the mark of a release that freed the RWMutex, which lasts 10 ms
			// (rwlib.lua): no acquisition
		default:
			t.Fatalf("unconfirmed acquisitions left %v behind", k)
		}
	}
}

func TestReplicas_RejectsBadInput(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	bg := context.Background()
	cases := map[string]func() error{
		"negative replicas": func() error { _, err := c.Mutex("x").Lock(bg, lock.WithReplicas(-1, time.Second)); return err },
		"zero timeout":      func() error { _, err := c.Mutex("x").Lock(bg, lock.WithReplicas(1, 0)); return err },
		"client option": func() error {
			_, err := lock.New(srv.Client(), lock.WithReplicaAck(1, -time.Second)).Mutex("x").Lock(bg)
			return err
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(); !errors.Is(err, lock.ErrInvalid) {
				t.Fatalf("error = %v, want ErrInvalid", err)
			}
		})
	}
}

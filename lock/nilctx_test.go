package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
	"github.com/seckillguard/seckillguard/lock"
)

// A nil context is bad input like any other: every exported method that
// takes a context answers ErrInvalid and never panics.
func TestNilContext_IsInvalidEverywhere(t *testing.T) {
	srv := testenv.Redis(t)
	c := instances(t, srv, 1)[0]
	name := lockName(t)
	var nilCtx context.Context
	m, f, rw := c.Mutex(name), c.FairMutex(name+":f"), c.RWMutex(name+":rw")
	ml, s, red := c.MultiLock(name+":a", name+":b"), c.Semaphore(name+":s", 1), lock.NewRedLock(name+":red", c)
	calls := map[string]func() error{
		"Mutex.Lock":           func() error { _, err := m.Lock(nilCtx); return err },
		"Mutex.TryLock":        func() error { _, err := m.TryLock(nilCtx, time.Second); return err },
		"Mutex.Unlock":         func() error { return m.Unlock(nilCtx) },
		"Mutex.IsLocked":       func() error { _, err := m.IsLocked(nilCtx); return err },
		"Mutex.HoldCount":      func() error { _, err := m.HoldCount(nilCtx); return err },
		"Mutex.TTL":            func() error { _, err := m.TTL(nilCtx); return err },
		"Mutex.ForceUnlock":    func() error { _, err := m.ForceUnlock(nilCtx); return err },
		"FairMutex.Lock":       func() error { _, err := f.Lock(nilCtx); return err },
		"FairMutex.TryLock":    func() error { _, err := f.TryLock(nilCtx, 0); return err },
		"FairMutex.Unlock":     func() error { return f.Unlock(nilCtx) },
		"RWMutex.RLock":        func() error { _, err := rw.RLock(nilCtx); return err },
		"RWMutex.TryRLock":     func() error { _, err := rw.TryRLock(nilCtx, 0); return err },
		"RWMutex.RUnlock":      func() error { return rw.RUnlock(nilCtx) },
		"RWMutex.Lock":         func() error { _, err := rw.Lock(nilCtx); return err },
		"RWMutex.TryLock":      func() error { _, err := rw.TryLock(nilCtx, 0); return err },
		"RWMutex.Unlock":       func() error { return rw.Unlock(nilCtx) },
		"MultiLock.Lock":       func() error { _, err := ml.Lock(nilCtx); return err },
		"MultiLock.TryLock":    func() error { _, err := ml.TryLock(nilCtx, 0); return err },
		"MultiLock.Unlock":     func() error { return ml.Unlock(nilCtx) },
		"Semaphore.Acquire":    func() error { _, err := s.Acquire(nilCtx); return err },
		"Semaphore.TryAcquire": func() error { _, err := s.TryAcquire(nilCtx, 0); return err },
		"Semaphore.Release":    func() error { return s.Release(nilCtx) },
		"RedLock.Lock":         func() error { _, err := red.Lock(nilCtx); return err },
		"RedLock.TryLock":      func() error { _, err := red.TryLock(nilCtx, 0); return err },
		"RedLock.Unlock":       func() error { return red.Unlock(nilCtx) },
	}
	for what, call := range calls {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			return call()
		}()
		if !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%s(nil) = %v, want ErrInvalid", what, err)
		}
	}
}

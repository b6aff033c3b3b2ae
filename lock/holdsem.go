package lock

import (
	"context"
	"sync"
)

// A holdSem is a hold's semaphore: one operation at a time enters the hold
// (see hold.enter), in the order they asked, and an operation waiting to
// enter gives up when its context ends. The zero value is free. Unlike a
// channel of one slot, which a select can wait on along with ctx.Done, it
// costs no allocation while nobody waits: a waiter makes the channel it is
// woken by only when the hold is in use.
type holdSem struct {
	mu      sync.Mutex
	busy    bool
	waiters []chan struct{} // in order of arrival; each is closed to hand the semaphore over
}

// take takes s, waiting until it is free or ctx ends; it returns
// ctx.Err() when it gave up. A waiter handed s as ctx ends has it (nil).
func (s *holdSem) take(ctx context.Context) error {
	s.mu.Lock()
	if !s.busy {
		s.busy = true
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return err
	}
	ch := make(chan struct{})
	s.waiters = append(s.waiters, ch)
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, w := range s.waiters {
		if w == ch {
			n := len(s.waiters) - 1
			copy(s.waiters[i:], s.waiters[i+1:])
			s.waiters[n] = nil
			s.waiters = s.waiters[:n]
			return ctx.Err()
		}
	}
	return nil // handed over as ctx ended: ch is closed, s is this caller's
}

// give lets s go: to the first waiter, or free.
func (s *holdSem) give() {
	s.mu.Lock()
	if len(s.waiters) == 0 {
		if !s.busy {
			s.mu.Unlock()
			panic("lock: holdSem released while free")
		}
		s.busy = false
		s.mu.Unlock()
		return
	}
	ch := s.waiters[0]
	n := copy(s.waiters, s.waiters[1:])
	s.waiters[n] = nil
	s.waiters = s.waiters[:n]
	s.mu.Unlock()
	close(ch)
}

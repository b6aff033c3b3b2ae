package lock

import "sync"

// An inflightHandover is a handover whose waiter was woken before its
// transfer reached Redis (see handOverAhead). done is closed once the
// outcome is known, lost once the hold is known lost (see hold.lose);
// a hold's semaphore is entered only after one of them (see hold.enter),
// so that no call on its field overtakes the transfer, and a lost hold
// answers at once however long the transfer's call still waits.
type inflightHandover struct {
	done     chan struct{}
	lost     chan struct{}
	lostOnce sync.Once

	mu      sync.Mutex
	settled bool // the outcome is known
	ok      bool // the transfer succeeded: the lock is the waiter's in Redis
	stray   bool // it failed, but may have left the waiter's field in the lock
}

// outcome reports whether p's outcome is known, and if so whether the
// transfer succeeded, and if not whether the waiter's field may be left.
func (p *inflightHandover) outcome() (settled, ok, stray bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.settled, p.ok, p.stray
}

// lose records that the hold p handed over was declared lost.
func (p *inflightHandover) lose() { p.lostOnce.Do(func() { close(p.lost) }) }

// record sets p's outcome.
func (p *inflightHandover) record(ok, stray bool) {
	p.mu.Lock()
	p.settled, p.ok, p.stray = true, ok, stray
	p.mu.Unlock()
}

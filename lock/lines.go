package lock

import (
	"sync"
	"sync/atomic"
)

// The waiting lines: a Client's goroutines that wait for a lock stand in a
// waitQueue per lock (queue.go), take turns with other Clients (turns.go)
// and are handed the lock by a releaser of the same Client (handover.go).

// lines owns a Client's wait queues: the queues by unlock channel, the
// relays that forward other Clients' unlock messages to them, and the
// subscriber whose messages wake them. Only its methods take qmu; the rest
// of the engine asks it.
type lines struct {
	*link
	subs *subscriber

	qmu    sync.Mutex
	queues map[string]*waitQueue    // by unlock channel
	nqueue atomic.Int32             // len(queues), set under qmu: 0 lets an uncontended Lock and Unlock skip qmu (see queued)
	relays map[string]map[relay]int // unlock channels forwarded to other Clients' queues
}

// newLines returns the empty waiting lines of the Client behind l, with
// the subscriber that wakes them.
func newLines(l *link) *lines {
	c := &lines{
		link:   l,
		queues: make(map[string]*waitQueue),
		relays: make(map[string]map[relay]int),
	}
	c.subs = newSubscriber(c)
	return c
}

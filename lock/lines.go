package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// The waiting lines: a Client's goroutines that wait for a lock stand in a
// waitQueue per lock (queue.go, their own state: waiter.go), take turns
// with other Clients (turns.go) and are handed the lock by a releaser of
// the same Client (handover.go).

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
	runs   map[string]*foreignRun   // turns beyond a queue's life, by unlock channel (see foreign.go)
	nruns  atomic.Int32             // len(runs), set under qmu: 0 lets a Lock and Unlock skip qmu
}

// newLines returns the empty waiting lines of the Client behind l, with
// the subscriber that wakes them.
func newLines(l *link) *lines {
	c := &lines{
		link:   l,
		queues: make(map[string]*waitQueue),
		relays: make(map[string]map[relay]int),
		runs:   make(map[string]*foreignRun),
	}
	c.subs = newSubscriber(l, c)
	return c
}

// A waitQueue lines up the goroutines of one Client that wait for one lock,
// in arrival order. Only its head tries to acquire; an unlock message wakes
// the head alone, so a release costs one attempt per Client rather than one
// per waiting goroutine, and a goroutine that just unlocked cannot overtake
// the ones already waiting.
type waitQueue struct {
	name    string // its key in lines.queues: the channel, and the lane if any (see laned)
	channel string
	waiters []*waiter
	sub     *chanSub // the unlock channel's subscription, taken by the first head that needs it

	handoffs int       // locks handed from holder to head in a row, without freeing (see cohortLimit)
	yield    time.Time // until then the head lets other Clients take the lock (see yieldDelay, turnStagger)
	others   int64     // other subscribers of the channel when this Client's last turn ended
	heard    int64     // unlock messages that ended other Clients' turns since then
	asked    time.Time // when others was counted (see othersListening)

	line lineWake // a FairMutex waiter's queue only: see lineWake
}

// A lineWake lets the first waiter in a FairMutex's line, whose queue here
// is its own channel's, be woken by the unlock messages of a Mutex of the
// same name too: a Mutex and a FairMutex of one name exclude each other,
// and a Mutex's release (release.lua) publishes on its own channel only.
// The waiter listens on that channel (relayed to its queue) all along, but
// only the first in line acts on it, or a Mutex's unlock would wake every
// waiter in the line; it is first when its last attempt said so, or when a
// message came on its own channel since (those go to the first in line
// only: see fairlib.lua and fair_leave.lua).
type lineWake struct {
	also   string   // the Mutex's unlock channel; "" for the queues of other kinds
	sub    *chanSub // its subscription, taken by the first turn
	behind bool     // the last attempt found others ahead, and no message on the own channel came since
	own    uint64   // messages heard on the own channel
	plain  uint64   // messages heard on also
}

// A lineMark is what a queue of a FairMutex waiter had heard when an attempt
// was sent (see lineMarkOf).
type lineMark struct{ own, plain uint64 }

// A laned kind lines its waiters up in a queue of their own, apart from the
// other waiters of the same channel; every message on the channel wakes the
// head of each lane. Its waiters enlist: a failed attempt takes the owner's
// place in a wait line in Redis, so a waiter tries at once when it becomes
// head, to take that place while the waiter before it holds the lock.
type laned interface {
	kind
	lane() string
}

// writersLane is the lane of an RWMutex's writers (writeKind). They wait on
// the channel of its readers but not behind them: only a queue's head tries,
// and a writer must be in the writers' line in Redis from the moment it
// waits, or the readers that arrive after it (in other Clients) keep it out.
const writersLane = "\x00writers"

// lanes are the suffixes of the queue names of a channel: "" for the kinds
// without a lane.
var lanes = [...]string{"", writersLane}

// A waiter is one goroutine in a waitQueue.
type waiter struct {
	notify chan struct{} // capacity 1: "look at your state again"
	shared bool          // waits for a lock several owners may hold at once
	enlist bool          // its attempts take a place in a wait line in Redis (see laned)

	// Guarded by lines.qmu.
	head   bool
	tryNow bool          // try to acquire without waiting
	bound  time.Duration // when it became head without tryNow: try after at most this long; <0 = unset

	grant // its side of the handovers (see handover.go)
}

// A relay forwards the unlock messages of one of this Client's channels to
// the queue of a channel of another Client: a RedLock waits in the queue of
// its first node and is woken by an unlock on any node.
type relay struct {
	to      *lines
	channel string
	line    bool // to a FairMutex waiter's queue, from its Mutex's channel: see lineWake
}

// A grant is a waiter's side of the handovers (see cohortLimit). h is the
// hold the waiter acquires, nil for the locks of several keys (MultiLock,
// RedLock); only holds whose kind can hand over (handing) are ever handed
// the lock. A releaser reads only the fields of h that do not change while
// it waits, and sets up h's renewal at a handover (see handOff). Guarded by
// lines.qmu.
type grant struct {
	h        *hold
	reserved bool          // a releaser is handing the lock over to this waiter
	trying   bool          // the waiter is trying to acquire by itself: no handover to it meanwhile
	granted  bool          // the lock was handed over: it is held for h
	grantTok fencing.Token // the token the handover gave h
	grantTop fencing.Token // the last token reserved for h's run of handovers (see tokenBlock)
	grantAt  time.Time     // when h's lease began: the handover was sent, or the releaser's lease began
	leaving  bool          // the waiter gave up: no handover any more
}

// A handing kind can hand its lock from a holder straight to a waiter of the
// same Client (see cohortLimit).
type handing interface {
	kind
	// transfer hands the lock from from, at its final release, to to,
	// setting a new lease when lease > 0 and keeping the lock's expiry
	// otherwise. It returns to's token and the last token reserved for
	// to's run of handovers, or a negative token when from does not hold
	// the lock any more.
	transfer(ctx context.Context, from, to *hold, lease time.Duration) (tok, top fencing.Token, err error)
	// abort frees the lock after a transfer from from to to whose outcome
	// is unknown, whichever of the two holds it, in one call: the transfer
	// may still be on its way, and finding from's field gone it then
	// changes nothing.
	abort(ctx context.Context, from, to *hold) error
	// probe reports whether h's lock is free, with one command, and if not,
	// how long to wait for an unlock message at most.
	probe(ctx context.Context, h *hold) (bool, time.Duration, error)
}

// yieldDelay is how long the head of a Client that has just ended a run of
// handovers (see cohortLimit) lets the waiters of other Clients take the
// lock before it tries itself. It is woken then even if the unlock message
// escaped it.
const yieldDelay = time.Millisecond

// A foreignRun is what a Client knows of one lock's turns beyond its wait
// queue's life. Guarded by lines.qmu.
type foreignRun struct {
	handoffs int       // the run of handovers of a queue that emptied (see waitQueue.handoffs), for the next queue
	foreign  int64     // foreign subscribers at the last count
	asked    time.Time // when they were counted
	back     time.Time // until then the Client's fresh Lock calls and new heads let the foreign waiters go first
	given    int       // Semaphore permits this Client gave back while foreign waiters listened (see permitGiven)
}

// Package history records what the holders of distributed locks did during
// a fault scenario and checks it against the guarantees of seckillguard.
//
// Two kinds of events make a history. A Hold is one critical section: who
// held which lock with which fencing token, from when to when, and whether
// (and when) its context announced that the lock was lost. A Write is one
// read-modify-write of the protected resource made under a hold: the value
// read, the value written, when, and whether the database accepted it.
//
// Check then asserts, per key:
//
//   - exclusion: a hold that another hold entered during was announced lost
//     before it left (so no two holds that were never told they lost the lock
//     overlap);
//   - token order: tokens strictly increase in the order holds entered;
//   - fencing: no write sent after its hold was announced lost was accepted,
//     and no write was accepted after a write with a newer token had been;
//   - no lost update: the accepted writes, in token order, form one chain in
//     which each write read the value the previous one wrote;
//   - linearizability: the accepted read-modify-writes are linearizable as
//     operations on a register (checked with porcupine);
//   - final state: the resource's final value is the last accepted write's;
//   - late notice: a holder is told of its loss within a tolerance after
//     another hold entered (NoticeWithin);
//   - writes under a hold: an accepted write's owner held the lock with the
//     write's token and had not left;
//   - refused means not applied: no write reported refused is visible in
//     the resource's final value and fence (Fences).
//
// Record every time with Now, the host's monotonic clock: a wall-clock step
// during a run then cannot reorder the events, also across processes.
//
// A Recorder collects a history from any number of goroutines; events that
// other processes report are added to it the same way.
package history

import (
	"sort"
	"sync"
	"time"
)

// Hold is one critical section under a lock.
type Hold struct {
	Key   string // the lock's name
	Owner string // who held it: a process and goroutine, a lock owner id
	Token int64  // the fencing token of the acquisition

	Enter time.Time // after Lock returned
	Leave time.Time // before Unlock was called; zero when the holder never left (it was killed)

	// LostAt is when the hold's context was cancelled with lock.ErrLost,
	// zero when it never was while held.
	LostAt time.Time
}

// Lost reports whether the holder was told its lock was lost before it
// left the critical section.
func (h Hold) Lost() bool {
	return !h.LostAt.IsZero() && (h.Leave.IsZero() || !h.LostAt.After(h.Leave))
}

// end returns Leave, or the far future for a hold that never left.
func (h Hold) end() time.Time {
	if h.Leave.IsZero() {
		return time.Unix(1<<40, 0)
	}
	return h.Leave
}

// Write is one read-modify-write of the protected resource under a hold:
// the holder read Read at ReadAt and wrote Value, sending the write at Start
// and learning its outcome at End.
type Write struct {
	Key   string // the resource, the same name as the lock protecting it
	Owner string // the hold's owner
	Token int64  // the token the write carried (the hold's)

	Read   int64
	ReadAt time.Time
	Value  int64

	Start    time.Time
	End      time.Time
	Accepted bool   // the database applied it
	Err      string // why it was refused, empty when accepted
}

// A Recorder collects a history. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	holds   []Hold
	writes  []Write
	initial map[string]int64
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{initial: make(map[string]int64)}
}

// Initial records the value of key before the scenario started (default 0).
func (r *Recorder) Initial(key string, v int64) {
	r.mu.Lock()
	r.initial[key] = v
	r.mu.Unlock()
}

// AddHold records a critical section.
func (r *Recorder) AddHold(h Hold) {
	r.mu.Lock()
	r.holds = append(r.holds, h)
	r.mu.Unlock()
}

// AddWrite records a write.
func (r *Recorder) AddWrite(w Write) {
	r.mu.Lock()
	r.writes = append(r.writes, w)
	r.mu.Unlock()
}

// History returns what was recorded so far.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := History{
		Holds:   append([]Hold(nil), r.holds...),
		Writes:  append([]Write(nil), r.writes...),
		Initial: make(map[string]int64, len(r.initial)),
	}
	for k, v := range r.initial {
		h.Initial[k] = v
	}
	return h
}

// History is a recorded history.
type History struct {
	Holds   []Hold
	Writes  []Write
	Initial map[string]int64 // value of each key before the run; missing keys start at 0
}

// Keys returns every key the history mentions, sorted.
func (h History) Keys() []string {
	seen := make(map[string]bool)
	for _, x := range h.Holds {
		seen[x.Key] = true
	}
	for _, w := range h.Writes {
		seen[w.Key] = true
	}
	for k := range h.Initial {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Summary counts what a history holds.
type Summary struct {
	Holds, LostHolds           int
	Writes, Accepted, Rejected int
	// RejectedOfLost counts the rejected writes whose hold was announced
	// lost; the rest were refused by the fence while the holder still
	// believed it held the lock.
	RejectedOfLost int
}

// Summarize counts the history's holds and writes.
func (h History) Summarize() Summary {
	var s Summary
	lost := make(map[holdRef]bool)
	for _, x := range h.Holds {
		s.Holds++
		if x.Lost() {
			s.LostHolds++
		}
		if !x.LostAt.IsZero() {
			lost[holdRef{x.Key, x.Owner, x.Token}] = true
		}
	}
	for _, w := range h.Writes {
		s.Writes++
		if w.Accepted {
			s.Accepted++
			continue
		}
		s.Rejected++
		if lost[holdRef{w.Key, w.Owner, w.Token}] {
			s.RejectedOfLost++
		}
	}
	return s
}

// holdRef identifies a hold: the writes made under it carry the same three.
type holdRef struct {
	key, owner string
	token      int64
}

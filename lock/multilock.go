package lock

import (
	"fmt"
	"sort"
	"strings"
)

// A MultiLock holds several locks as one: "stock and balance together, or
// not at all". Its locks are plain Mutex locks of the given names (Redisson's
// RLock layout), so a MultiLock excludes, and re-enters, the Mutex of each
// of its names.
//
// All or none: Lock returns with every lock held, or with none of them held
// by this call. When all names live on one node (a single Redis or Sentinel
// deployment, or one Cluster slot, which hash tags such as "{order:7}:stock"
// and "{order:7}:balance" arrange) the whole set is taken and released by one
// script, so nobody ever observes part of it held. Across Cluster slots the
// set is taken slot by slot in one global order (by slot, then by key) that
// every MultiLock follows whatever order its names were given in, so two
// MultiLocks over the same names never deadlock; while it waits for a later
// slot it holds the earlier ones, renewed by the watchdog from the moment
// each is taken, and when it gives up (TryLock's wait, its context, an
// error) it releases them. If one of them is lost meanwhile (deleted, or a
// WithLease lease shorter than the wait ran out), Lock releases the rest
// and returns an error matching ErrLost.
//
// The context Lock returns carries one fencing token that is valid for every
// lock of the set: it is above every token issued before for any of them,
// and each lock's counter is raised to it, so every later token of any of
// them is above it. It is cancelled with cause ErrLost as soon as any of the
// locks is lost, and the others are released then: they are free for others
// without waiting for the caller's Unlock, which answers ErrLost.
//
// A MultiLock is reentrant through its context like a Mutex. Names that
// appear twice are locked once. A MultiLock does no I/O until used and may
// be copied freely.
type MultiLock struct {
	handle            // name: the names as given, for errors
	locks  []*Mutex   // in the global order, without duplicates
	groups [][]*Mutex // locks that share a hash slot (one group unless Cluster)
	id     string     // the set's identity in contexts
}

// multiKey is the context key of a MultiLock's hold.
type multiKey struct {
	c  *engine
	id string
}

// A multiHold is one acquisition of a MultiLock and its re-entries.
type multiHold struct {
	compoundHold // guarded by the semaphores of its holds, as is done

	done map[string]bool // locks an Unlock in progress has released already (it failed on others)
}

// newMultiLock returns the MultiLock of the engine c (nil: of a nil Client): see
// Client.MultiLock.
func newMultiLock(c *engine, names ...string) *MultiLock {
	ml := &MultiLock{handle: handle{c: c, name: strings.Join(names, ", ")}}
	switch {
	case c == nil:
		ml.checkErr = fmt.Errorf("%w: nil lock client", ErrInvalid)
		return ml
	case len(names) == 0:
		ml.checkErr = fmt.Errorf("%w: a MultiLock needs at least one lock name", ErrInvalid)
		return ml
	}
	seen := make(map[string]bool)
	full := make([]string, 0, len(names))
	for _, n := range names {
		m := newMutex(c, n)
		if m.checkErr != nil {
			ml.checkErr = m.checkErr
			return ml
		}
		full = append(full, m.key)
		if !seen[m.key] {
			seen[m.key] = true
			ml.locks = append(ml.locks, m)
		}
	}
	sort.Slice(ml.locks, func(i, j int) bool {
		si, sj := slot(ml.locks[i].key), slot(ml.locks[j].key)
		if si != sj {
			return si < sj
		}
		return ml.locks[i].key < ml.locks[j].key
	})
	keys := make([]string, len(ml.locks))
	for i, m := range ml.locks {
		keys[i] = m.key
		if i == 0 || (c.cluster && slot(m.key) != slot(ml.locks[i-1].key)) {
			ml.groups = append(ml.groups, nil)
		}
		ml.groups[len(ml.groups)-1] = append(ml.groups[len(ml.groups)-1], m)
	}
	ml.id = strings.Join(keys, "\x00")
	ml.name = strings.Join(full, ", ") // the full names, as given: errors and logs show them
	return ml
}

// Names returns the names of the locks in the order they are taken.
func (ml *MultiLock) Names() []string {
	if ml == nil {
		return nil
	}
	out := make([]string, len(ml.locks))
	for i, m := range ml.locks {
		out[i] = m.given
	}
	return out
}

// usable returns the error every operation of ml starts with, if any.
func (ml *MultiLock) usable() error {
	if ml == nil {
		return fmt.Errorf("%w: nil multilock", ErrInvalid)
	}
	return ml.handle.usable()
}

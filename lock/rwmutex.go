package lock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// Names of an RWMutex's keys and channel besides its hash.
const (
	rwChannelPrefix = "redisson_rwlock" // Redisson's
	readersPrefix   = "seckillguard_rwlock_readers"
	writersPrefix   = "seckillguard_rwlock_writers"
)

// An RWMutex is a distributed reader/writer lock: many readers at once, or
// one writer. It shares the keys of Redisson's RReadWriteLock of the same
// name with their meaning: the hash (a "mode" field, a field per reader
// counting its holds, a "<...>:write" field counting the writer's), the
// channel, and each read level's timeout key
// "{<name>}:<uuid>:<owner>:rwlock_timeout:<level>" expiring with the hold's
// lease, so readers and writers of both sides exclude each other on one
// name. What this package adds lives in keys Redisson never reads, and it
// behaves differently where Redisson's users get hurt:
//
//   - It prefers writers: once a writer waits, new readers wait behind it
//     (even while the lock is free, until the woken writer has taken it),
//     so a steady stream of readers cannot starve a writer. (Owners that
//     already hold a read lock may still re-enter it.) A stream of writers
//     can in turn hold readers off. Within a Client, writers wait in a line
//     of their own, each in the writers' line in Redis from the moment it
//     waits, not behind the Client's readers. Redisson's readers do not
//     honour that line: a Java reader may overtake a waiting writer. Nor
//     do Redisson's writers stand in it: readers that overlap without a
//     gap keep a Java writer out.
//   - Each read hold has a lease of its own, renewed by the watchdog for
//     its holder only (its own timeout keys among them); a reader that
//     crashed drops out for this package's writers when its lease ends,
//     however many other readers come and go. Redisson's writers wait for
//     the hash to go, which a live Java reader's renewal delays; Redisson
//     before 4.4.0 also renews every reader's timeout keys, so there a dead
//     reader of ours lives as long as a live Java reader (docs/LOCKS.md).
//   - A writer may take the read lock under its write lock (a downgrade):
//     releasing the write lock then leaves the read hold, whose context
//     descends from the context the write lock was taken with (not from
//     the write lock's), so it lives on until RUnlock. A reader asking
//     for the write lock gets ErrUpgrade at once instead of waiting for
//     itself forever.
//
// Both locks are reentrant through the contexts they return, like Mutex.
// The write lock issues fencing tokens (from the same counter a Mutex of
// the name would use). A read hold issues none: readers must not write. The
// context of a read hold keeps the token of any other exclusive lock it
// descends from.
//
// An RWMutex does no I/O until used and may be copied freely.
type RWMutex struct {
	handle
	key    string
	keys   []string // hash, readers, writers, channel, timeout keys' start
	mark   string   // the channel's mark (see markChannel)
	wkeys  []string // keys + token counter
	rk, wk any      // the context keys of its read and write holds (see heldKey)
	read   readKind
	write  writeKind
}

// readKind is the kind of read holds. over is the write field of the hold a
// downgrade takes its read hold under; empty otherwise.
type readKind struct {
	rw   *RWMutex
	over string
}
type writeKind struct{ rw *RWMutex }

// newRWMutex returns the RWMutex of the engine c (nil: of a nil Client): see
// Client.RWMutex.
func newRWMutex(c *engine, name string) *RWMutex {
	rw := &RWMutex{handle: handle{c: c, name: name, given: name}}
	rw.read.rw, rw.write.rw = rw, rw
	if c == nil {
		rw.checkErr = fmt.Errorf("%w: nil lock client", ErrInvalid)
		return rw
	}
	if rw.checkErr = checkName(name); rw.checkErr != nil {
		return rw
	}
	rw.key = c.key(name)
	rw.name = rw.key
	if rw.checkErr = checkName(rw.key); rw.checkErr != nil {
		return rw
	}
	rw.keys = []string{rw.key, derived(readersPrefix, rw.key), derived(writersPrefix, rw.key), derived(rwChannelPrefix, rw.key), timeoutBase(rw.key)}
	rw.mark = markChannel(rw.keys[3], c.cluster)
	rw.wkeys = append(append([]string{}, rw.keys...), derived(tokenPrefix, rw.key))
	rw.rk, rw.wk = c.holdKey(rw.key, reader), c.holdKey(rw.key, writer)
	return rw
}

// Name returns the lock's name as given to Client.RWMutex.
func (rw *RWMutex) Name() string {
	if rw == nil {
		return ""
	}
	return rw.given
}

func (rw *RWMutex) usable() error {
	if rw == nil {
		return fmt.Errorf("%w: nil rw mutex", ErrInvalid)
	}
	return rw.handle.usable()
}

// RLock acquires a read hold, waiting as long as it takes or until ctx ends,
// and returns the context that holds it (see Mutex.Lock). It waits while a
// writer holds the lock, and also while a writer waits for it, unless ctx
// already holds the read lock (a re-entry) or the write lock (a downgrade).
// The read hold ends with ctx (see Mutex.Lock); a downgrade's read hold ends
// with the context the write lock was taken with.
func (rw *RWMutex) RLock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return rw.rlock(ctx, -1, opts)
}

// TryRLock is RLock with a bounded wait: it gives up after wait with
// ErrNotAcquired. wait 0 makes exactly one attempt; a negative wait is an
// error (ErrInvalid).
func (rw *RWMutex) TryRLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(rw.Name(), wait); err != nil {
		return ctx, err
	}
	return rw.rlock(ctx, wait, opts)
}

func (rw *RWMutex) rlock(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := rw.usable(); err != nil {
		return ctx, err
	}
	k := &rw.read
	if ctx != nil && ctx.Err() == nil && heldBy(ctx, rw.rk) == nil {
		// A downgrade: the read hold must outlive the write lock, so its
		// context descends from the one the write lock was taken with.
		if wh := heldVia(ctx, rw.wk); wh != nil {
			ctx = wh.parent
			k = &readKind{rw: rw, over: wh.field}
		}
	}
	return rw.c.acquire(ctx, k, rw.key, reader, rw.rk, rw.name, wait, opts)
}

// RUnlock releases one level of the read hold of ctx, as Mutex.Unlock does.
// The last reader out wakes the waiting writers.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	if err := rw.usable(); err != nil {
		return err
	}
	return rw.c.unlock(ctx, rw.rk, rw.name)
}

// Lock acquires the write lock, waiting as long as it takes or until ctx
// ends, and returns the context that holds it (see Mutex.Lock); from the
// moment it waits, new readers wait too. If ctx holds a read hold of this
// lock and not the write lock, Lock returns ErrUpgrade at once. The write
// hold ends with ctx (see Mutex.Lock).
func (rw *RWMutex) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return rw.lock(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: it gives up after wait with
// ErrNotAcquired (and stops keeping readers out). wait 0 makes exactly one
// attempt; a negative wait is an error (ErrInvalid).
func (rw *RWMutex) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(rw.Name(), wait); err != nil {
		return ctx, err
	}
	return rw.lock(ctx, wait, opts)
}

func (rw *RWMutex) lock(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := rw.usable(); err != nil {
		return ctx, err
	}
	if ctx != nil && heldVia(ctx, rw.rk) != nil && heldBy(ctx, rw.wk) == nil {
		return ctx, wrap(rw.name, ErrUpgrade)
	}
	return rw.c.acquire(ctx, &rw.write, rw.key, writer, rw.wk, rw.name, wait, opts)
}

// Unlock releases one level of the write hold of ctx, as Mutex.Unlock does.
// Releasing the last level wakes the waiters; read holds ctx took under the
// write lock stay held.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	if err := rw.usable(); err != nil {
		return err
	}
	return rw.c.unlock(ctx, rw.wk, rw.name)
}

// timeoutBase returns what the timeout keys of key's read holds start with,
// as Redisson names them: "{<key>}", or key itself when it holds a "{"
// (level i of reader field f: "<base>:<f>:rwlock_timeout:<i>").
func timeoutBase(key string) string {
	if strings.Contains(key, "{") {
		return key
	}
	return "{" + key + "}"
}

// readerField returns the read field of the owner of a write hold.
func readerField(writeField string) string { return strings.TrimSuffix(writeField, ":write") }

func (k *readKind) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	rw := k.rw
	lease, _ := rw.c.leaseArgs(h)
	r, err := readPair(readAcquireScript.run(ctx, via, rw.keys, lease, h.field, k.writeField(h), 0, rw.c.publish, rw.mark, rw.c.numsub()))
	if err != nil {
		return false, 0, err
	}
	switch {
	case r.is(1):
		return true, 0, nil
	case r.is(0):
		return false, retryAfter(rw.c.link, r.value), nil
	}
	return false, 0, r.unexpected("read acquire")
}

func (k *readKind) reenter(ctx context.Context, h *hold) (bool, error) {
	rw := k.rw
	_, lease := rw.c.leaseArgs(h)
	r, err := readPair(rw.c.run(ctx, readAcquireScript, rw.keys, lease, h.field, k.writeField(h), h.levels, rw.c.publish, rw.mark, rw.c.numsub()))
	if err != nil {
		return false, err
	}
	return r.is(1), nil
}

// writeField is the write field under which a first read hold is granted
// while the lock is write-held: the downgraded write hold's, or for other
// read holds a field no writer has.
func (k *readKind) writeField(h *hold) string {
	if k.over != "" {
		return k.over
	}
	return h.field + ":write"
}

func (k *readKind) release(ctx context.Context, h *hold) (int64, error) {
	rw := k.rw
	return rw.c.run(ctx, readReleaseScript, rw.keys, h.field, h.levels, rw.c.publish).Int64()
}

func (k *readKind) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired {
		return
	}
	rw := k.rw
	if err := rw.c.run(ctx, readReleaseScript, rw.keys, h.field, 1, rw.c.publish).Err(); err != nil {
		rw.c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not roll back a read acquisition of unknown outcome; it expires with its lease",
			"lock", rw.name, "lease", h.lease, "err", err)
	}
}

func (k *readKind) renewal(h *hold) (*script, []string, []any) {
	return readRenewScript, k.rw.renewKeys(), []any{h.field}
}

// renewKeys are the keys read_renew.lua takes for one hold.
func (rw *RWMutex) renewKeys() []string { return []string{rw.keys[0], rw.keys[1], rw.keys[4]} }

func (k *readKind) channel(*hold) string { return k.rw.keys[3] }
func (k *readKind) shared() bool         { return true }
func (k *readKind) tokens() bool         { return false }

func (k *writeKind) attempt(ctx context.Context, via processor, h *hold) (bool, time.Duration, error) {
	rw := k.rw
	lease, _ := rw.c.leaseArgs(h)
	r, err := readPair(writeAcquireScript.run(ctx, via, rw.wkeys, lease, h.field, readerField(h.field), 0, rw.c.publish, rw.c.leaseMS, rw.c.tokenTTL))
	if err != nil {
		return false, 0, err
	}
	switch {
	case r.is(1):
		h.token = fencing.Token(r.value)
		return true, 0, nil
	case r.is(0):
		rw.c.inLine(h, waitingScript, []string{rw.keys[2], rw.keys[2]}, []any{h.field})
		return false, retryAfter(rw.c.link, r.value), nil
	case r.is(-2):
		return false, 0, ErrUpgrade
	}
	return false, 0, r.unexpected("write acquire")
}

func (k *writeKind) reenter(ctx context.Context, h *hold) (bool, error) {
	rw := k.rw
	_, lease := rw.c.leaseArgs(h)
	r, err := readPair(rw.c.run(ctx, writeAcquireScript, rw.wkeys, lease, h.field, readerField(h.field), h.levels, rw.c.publish, rw.c.leaseMS, rw.c.tokenTTL))
	if err != nil {
		return false, err
	}
	return r.is(1), nil
}

func (k *writeKind) release(ctx context.Context, h *hold) (int64, error) {
	rw := k.rw
	return rw.c.run(ctx, writeReleaseScript, rw.keys, h.field, h.levels, rw.c.publish).Int64()
}

func (k *writeKind) undo(ctx context.Context, h *hold, acquired bool) {
	if !acquired && !h.queued {
		return
	}
	rw := k.rw
	drop := "0"
	if acquired {
		drop = "1"
	}
	if err := rw.c.run(ctx, writeLeaveScript, rw.keys, h.field, rw.c.publish, drop).Err(); err != nil {
		rw.c.opts.logger.WarnContext(h.logContext(ctx), "lock: could not stop waiting for a write lock; readers wait until the watchdog timeout",
			"lock", rw.name, "timeout", rw.c.opts.watchdogTimeout, "err", err)
	}
}

func (k *writeKind) renewal(h *hold) (*script, []string, []any) {
	// A write hold's lease is its score among the holders' leases, as a
	// read hold's is: its renewal is the readers' (see rwlib.lua).
	return readRenewScript, k.rw.renewKeys(), []any{h.field}
}

func (k *writeKind) channel(*hold) string { return k.rw.keys[3] }
func (k *writeKind) lane() string         { return writersLane }
func (k *writeKind) shared() bool         { return false }
func (k *writeKind) tokens() bool         { return true }

// observedAs names a read hold to the Observer (see kindOf).
func (*readKind) observedAs() (Kind, string) { return KindRWMutex, "read" }

// observedAs names a write hold to the Observer (see kindOf).
func (*writeKind) observedAs() (Kind, string) { return KindRWMutex, "write" }

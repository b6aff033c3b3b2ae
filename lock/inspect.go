package lock

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// InspectLimit is the most entries Inspect reads from each line or set of a
// lock (fair waiters, waiting writers, read leases, semaphore holders); the
// lengths it reports are the whole ones.
const InspectLimit = 1000

// Held reports whether anyone holds the lock.
func (in *Inspection) Held() bool { return len(in.Owners) > 0 }

// Side returns "foreign" for a foreign FairMutex waiter (see Foreign), else
// "ours".
func (w Waiter) Side() string {
	if w.Foreign {
		return "foreign"
	}
	return "ours"
}

// Inspect reads what Redis holds for the lock called name (namespace
// applied): who holds it with which hold counts, its remaining lease, its
// fencing counter, and who waits for it. It changes nothing, holds nothing,
// and works on single nodes, Sentinel and Cluster, for every kind of this
// package and for locks Redisson took.
func (c *Client) Inspect(ctx context.Context, name string) (*Inspection, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	key := c.key(name)
	if err := checkName(key); err != nil {
		return nil, err
	}
	keys := []string{key, derived(tokenPrefix, key), derived(queuePrefix, key), derived(timeoutPrefix, key),
		derived(readersPrefix, key), derived(writersPrefix, key), derived(alivePrefix, key), timeoutBase(key), permitsKey(key)}
	raw, err := c.run(ctx, inspectScript, keys, InspectLimit).Slice()
	if err != nil {
		return nil, wrap(key, unavailable(err))
	}
	in, err := parseInspection(name, key, raw)
	if err != nil {
		return nil, wrap(key, err)
	}
	if err := c.countSubscribers(ctx, in); err != nil {
		return nil, wrap(key, unavailable(err))
	}
	return in, nil
}

// parseInspection decodes inspect.lua's reply.
func parseInspection(name, key string, r []any) (*Inspection, error) {
	if len(r) != 14 {
		return nil, fmt.Errorf("inspect: reply of %d parts, want 14", len(r))
	}
	d := inspectReply{now: replyNum(r[11])}
	in := &Inspection{Name: name, Key: key}
	switch typ := replyStr(r[0]); typ {
	case "none":
	case "hash":
		d.hashOwners(in, replyList(r[2]), replyList(r[8]), replyList(r[13]))
	case "string":
		if _, err := strconv.ParseInt(replyStr(r[3]), 10, 64); err != nil {
			return nil, fmt.Errorf("%w: key %q is a string that is not a count of permits, not a lock", ErrInvalid, key)
		}
		d.permitOwners(in, replyList(r[2]))
	default:
		return nil, fmt.Errorf("%w: key %q is a %s, not a lock", ErrInvalid, key, typ)
	}
	// The writer first, then the readers in field order.
	sort.SliceStable(in.Owners, func(i, j int) bool { return in.Owners[i].Write && !in.Owners[j].Write })
	in.Lease = remaining(replyNum(r[1]))
	if tok := r[3]; tok != nil && in.Kind == KindSemaphore {
		in.Free = replyNum(tok)
	} else if tok != nil {
		in.Token = replyNum(tok)
	}
	in.TokenTTL = remaining(replyNum(r[4]))
	in.Queue = d.line(replyList(r[5]), replyList(r[7]), replyList(r[12]))
	in.QueueLen = replyNum(r[6])
	in.Writers = d.writers(replyList(r[9]))
	in.WritersLen = replyNum(r[10])
	return in, nil
}

// inspectReply decodes the parts of inspect.lua's reply whose times are
// deadlines in milliseconds on the server's clock, now at the inspection.
type inspectReply struct{ now int64 }

// left is the time from the inspection to deadline.
func (d inspectReply) left(deadline int64) time.Duration {
	return time.Duration(deadline-d.now) * time.Millisecond
}

// hashOwners reads the owners of a lock hash (a Mutex, FairMutex or
// RWMutex): entries are its fields and counts, readLeases an RWMutex's
// holders and their lease ends, timeouts its readers and the longest PTTL
// among each one's timeout keys (a Redisson reader's lease).
func (d inspectReply) hashOwners(in *Inspection, entries, readLeases, timeouts []any) {
	in.Kind = KindMutex
	readLease := make(map[string]time.Duration)
	for i := 0; i+1 < len(timeouts); i += 2 {
		if ms := replyNum(timeouts[i+1]); ms > 0 {
			readLease[replyStr(timeouts[i])] = time.Duration(ms) * time.Millisecond
		}
	}
	for i := 0; i+1 < len(readLeases); i += 2 {
		readLease[replyStr(readLeases[i])] = d.left(replyNum(readLeases[i+1]))
	}
	for i := 0; i+1 < len(entries); i += 2 {
		if replyStr(entries[i]) == "mode" {
			in.Kind, in.Mode = KindRWMutex, replyStr(entries[i+1])
		}
	}
	for i := 0; i+1 < len(entries); i += 2 {
		f := replyStr(entries[i])
		if f == "mode" {
			continue
		}
		var o Owner
		if base, ok := strings.CutSuffix(f, ":write"); ok && in.Kind == KindRWMutex {
			o = inspectedOwner(base)
			o.Field, o.Write = f, true
		} else {
			o = inspectedOwner(f)
			o.Lease = readLease[f] // 0 unless it is an RWMutex's read hold
		}
		o.Holds = replyNum(entries[i+1])
		in.Owners = append(in.Owners, o)
	}
}

// permitOwners reads a Semaphore's holders and their lease ends. A
// Redisson permit's id (16 random bytes) is shown in hex, as Redisson shows
// it, and one without a lease (Redisson's score for it) has Lease -1.
func (d inspectReply) permitOwners(in *Inspection, entries []any) {
	in.Kind = KindSemaphore
	for i := 0; i+1 < len(entries); i += 2 {
		id := replyStr(entries[i])
		var o Owner
		if utf8.ValidString(id) && strings.IndexByte(id, ':') >= 0 {
			o = inspectedOwner(id)
		} else {
			o = Owner{Field: hex.EncodeToString([]byte(id))}
		}
		o.Holds, o.Lease = 1, d.left(replyNum(entries[i+1]))
		if replyNum(entries[i+1]) >= redissonNoLease {
			o.Lease = -1
		}
		in.Owners = append(in.Owners, o)
	}
}

// redissonNoLease is the score of a Redisson permit taken without a lease.
const redissonNoLease = 922337203685477

// line reads a FairMutex's line: its waiters in order, their Redisson
// deadlines, and the liveness deadlines this package's waiters keep; a
// waiter without one is another client's.
func (d inspectReply) line(waiters, deadlines, alive []any) []Waiter {
	var out []Waiter
	for i, w := range waiters {
		wt := inspectedWaiter(replyStr(w))
		if i < len(deadlines) && deadlines[i] != nil {
			wt.Deadline = d.left(replyNum(deadlines[i]))
		}
		wt.Expires, wt.Foreign = wt.Deadline, true
		if i < len(alive) && alive[i] != nil {
			wt.Expires, wt.Foreign = d.left(replyNum(alive[i])), false
		}
		out = append(out, wt)
	}
	return out
}

// writers reads an RWMutex's waiting writers and their deadlines.
func (d inspectReply) writers(wl []any) []Waiter {
	var out []Waiter
	for i := 0; i+1 < len(wl); i += 2 {
		wt := inspectedWaiter(replyStr(wl[i]))
		wt.Expires = d.left(replyNum(wl[i+1]))
		out = append(out, wt)
	}
	return out
}

func replyStr(v any) string { s, _ := v.(string); return s }

func replyList(v any) []any { l, _ := v.([]any); return l }

// replyNum reads an integer reply, or a number sent as a string (a sorted
// set's score).
func replyNum(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return int64(math.Round(f))
	}
	return 0
}

// remaining turns a PTTL reply into a remaining time: 0 for no key, -1 for
// a key without expiry.
func remaining(pttl int64) time.Duration {
	switch {
	case pttl == -2:
		return 0
	case pttl < 0:
		return -1
	}
	return time.Duration(pttl) * time.Millisecond
}

// inspectedOwner splits a holder field "<clientID>:<ownerID>" at its last colon.
func inspectedOwner(field string) Owner {
	o := Owner{Field: field}
	if i := strings.LastIndexByte(field, ':'); i >= 0 {
		o.ClientID, o.OwnerID = field[:i], field[i+1:]
	}
	return o
}

// inspectedWaiter splits a place in a line the same way; a waiting
// writer's place is its write field "<clientID>:<ownerID>:write".
func inspectedWaiter(field string) Waiter {
	base, _ := strings.CutSuffix(field, ":write")
	o := inspectedOwner(base)
	return Waiter{Field: field, ClientID: o.ClientID, OwnerID: o.OwnerID}
}

// countSubscribers fills in the unlock channels of the lock and their
// subscriber counts.
func (c *engine) countSubscribers(ctx context.Context, in *Inspection) error {
	names := []string{derived(channelPrefix, in.Key), derived(rwChannelPrefix, in.Key), derived(semChannelPrefix, in.Key)}
	for _, w := range in.Queue {
		names = append(names, derived(channelPrefix, in.Key)+":"+w.Field)
	}
	var counts map[string]int64
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		// Shard channels are known only to the nodes of their slot.
		var node *redis.Client
		if node, err = cc.MasterForKey(ctx, in.Key); err == nil {
			counts, err = node.PubSubShardNumSub(ctx, names...).Result()
		}
	} else {
		counts, err = c.rdb.PubSubNumSub(ctx, names...).Result()
	}
	if err != nil {
		return err
	}
	for _, n := range names {
		in.Channels = append(in.Channels, Channel{Name: n, Subscribers: counts[n]})
	}
	return nil
}

// derivedPrefixes are the prefixes of the keys derived from lock names,
// which Scan does not report as locks.
var derivedPrefixes = []string{tokenPrefix + ":", queuePrefix + ":", timeoutPrefix + ":", readersPrefix + ":", writersPrefix + ":",
	alivePrefix + ":", waitPrefix + ":"}

// Scan returns the names of the locks whose keys match the glob pattern
// (namespace applied; the names are returned without it), at most limit of
// them, with SCAN, so Redis is never blocked; on a Cluster every master is
// scanned. A key counts as a lock when it is a hash (the lock kinds but
// Semaphore) or a string holding an integer (a Semaphore's free permits) and
// not one of the keys derived from a lock name (token counters, wait lines,
// lease sets, an RWMutex's readers' timeout keys, a Semaphore's permits).
// Scan reads at most 100 keys per name wanted, so a pattern that matches
// mostly other keys ends early; the names are sorted.
func (c *Client) Scan(ctx context.Context, pattern string, limit int) ([]string, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%w: scan limit %d, want at least 1", ErrInvalid, limit)
	}
	s := &lockScan{match: c.key(pattern), limit: limit, budget: int64(limit) * 100}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		// One master at a time: found and budget are shared.
		var (
			mu      sync.Mutex
			masters []*redis.Client
		)
		err = cc.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock() // called for every master at once
			defer mu.Unlock()
			masters = append(masters, m)
			return nil
		})
		for _, m := range masters {
			if err != nil {
				break
			}
			err = s.node(ctx, m)
		}
	} else {
		err = s.node(ctx, c.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("lock: scan %q: %w", s.match, err)
	}
	names := make([]string, len(s.found))
	for i, k := range s.found {
		names[i] = strings.TrimPrefix(k, c.opts.namespace+":")
		if c.opts.namespace == "" {
			names[i] = k
		}
	}
	sort.Strings(names)
	return names, nil
}

// A lockScan is one Scan: the keys of locks it found, across the nodes it
// scans one after the other, and the keys it may still read.
type lockScan struct {
	match  string
	limit  int
	budget int64
	found  []string
}

// node scans one node (or the only one) until the scan has found its limit,
// read its budget of keys, or the node has no more.
func (s *lockScan) node(ctx context.Context, node redis.Cmdable) error {
	var cursor uint64
	for s.budget > 0 && len(s.found) < s.limit {
		keys, next, err := node.Scan(ctx, cursor, s.match, 100).Result()
		if err != nil {
			return err
		}
		s.budget -= 100
		for _, k := range keys {
			if len(s.found) >= s.limit || isDerived(k) {
				continue
			}
			lock, err := isLockKey(ctx, node, k)
			if err != nil {
				return err
			}
			if lock {
				s.found = append(s.found, k)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return nil
}

// isLockKey reports whether key, not one derived from a lock name, is a
// lock's: a hash (every kind but Semaphore) or a string holding an integer
// (a Semaphore's count of free permits).
func isLockKey(ctx context.Context, node redis.Cmdable, key string) (bool, error) {
	typ, err := node.Type(ctx, key).Result()
	if err != nil || typ == "hash" {
		return err == nil, err
	}
	if typ != "string" {
		return false, nil
	}
	v, err := node.Get(ctx, key).Result()
	if err == redis.Nil {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, perr := strconv.ParseInt(v, 10, 64)
	return perr == nil, nil
}

func isDerived(key string) bool {
	// An RWMutex reader's timeout key "<base>:<field>:rwlock_timeout:<level>"
	// (see timeoutBase).
	if i := strings.LastIndex(key, ":rwlock_timeout:"); i >= 0 {
		if _, err := strconv.ParseUint(key[i+len(":rwlock_timeout:"):], 10, 32); err == nil {
			return true
		}
	}
	for _, p := range derivedPrefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

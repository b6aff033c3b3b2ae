package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/seckillguard/seckillguard/ctxend"
	"github.com/seckillguard/seckillguard/fencing"
)

// A RedLock is one lock over N independent Redis deployments (N Clients, each
// on its own master; not replicas of one another, not one Cluster): it is
// held when a majority of N/2+1 of them hold it. It is antirez's Redlock
// algorithm, as Redisson's RedissonRedLock implements it:
//
//   - An attempt sends the Mutex acquire script to every node at once, each
//     bounded by a short timeout (a tenth of the lease, between 50ms and
//     1s), and succeeds when a majority took it within the validity time:
//     lease - elapsed - drift (drift = lease/100 + 2ms). Otherwise it
//     releases every node it may have taken and waits, for an unlock
//     message from any node or the shortest remaining lease, with a random
//     delay after a split vote so that contenders do not collide forever.
//   - While held, each node is renewed by its own Client's watchdog, and
//     without WithLease each node's lease is its own Client's watchdog
//     timeout, so that the renewals of every node come at a third of the
//     lease they extend whatever the other Clients' timeouts; a node
//     whose renewals fail until its lease ends is lost, and when fewer than
//     a majority remain the RedLock's context is cancelled with a cause
//     matching both ErrLost and ErrNoQuorum. With WithLease it ends after
//     the validity time instead.
//   - When fewer than a majority of the nodes can be reached at all, Lock
//     fails at once with ErrNoQuorum rather than waiting: that is an outage,
//     not contention.
//
// Be honest about what this buys. Martin Kleppmann ("How to do distributed
// locking", 2016) showed that Redlock's safety rests on timing assumptions:
// a process pause, a network delay or a clock jump longer than the
// remaining validity lets two holders overlap, and Redlock itself offers no
// way to detect it. antirez's reply ("Is Redlock safe?") defends the
// algorithm when clocks are monotonic and bounded, which real deployments
// cannot promise either. Neither disputes that a lock protecting
// correctness needs fencing at the storage. So this RedLock issues one:
// the context carries the largest of the tokens its majority issued, and
// that token is written back to the majority's counters before Lock
// returns. Any later acquisition's majority shares at least one node with
// this one, whose counter is now at least this token, so every later
// RedLock token is larger: fence your writes with it (package fencing,
// gormplugin) and a holder that overlapped another is refused at the
// database. A RedLock costs 2 round trips (in parallel over the nodes) to
// acquire and N renewals per period; consider one Redis with fencing first.
//
// Each node uses the Mutex layout under the node Client's namespace: a
// Mutex of the same name on one node's Client and the RedLock exclude each
// other there. A RedLock is reentrant through its context. It does no I/O
// until used and may be copied freely.
type RedLock struct {
	handle  // no Client: it has clients
	clients []*Client
	nodes   []*Mutex // nodes[i] is the lock on clients[i]
	order   []int    // client indexes in a global order (by Client id)
	quorum  int
	id      string
}

// redKey is the context key of a RedLock's hold.
type redKey struct{ id string }

// A redHold is one acquisition of a RedLock and its re-entries.
type redHold struct {
	compoundHold // its holds are the nodes it holds, by client index; nil where it has none

	mu     sync.Mutex         // guards levels, ended and alive
	alive  int                // nodes still held
	expire context.CancelFunc // releases the validity timer; nil without WithLease
}

// NewRedLock returns the lock called name over clients, one Client per
// independent Redis master. It does no I/O; no clients, a nil or repeated
// Client or an invalid name is reported by the first operation (ErrInvalid).
func NewRedLock(name string, clients ...*Client) *RedLock {
	r := &RedLock{handle: handle{name: name, given: name}, clients: clients, quorum: len(clients)/2 + 1}
	if len(clients) == 0 {
		r.checkErr = fmt.Errorf("%w: a RedLock needs at least one Client", ErrInvalid)
		return r
	}
	seen := make(map[*Client]bool)
	ids := make([]string, 0, len(clients))
	for i, c := range clients {
		if c == nil {
			r.checkErr = fmt.Errorf("%w: Client %d of the RedLock is nil", ErrInvalid, i)
			return r
		}
		if seen[c] {
			r.checkErr = fmt.Errorf("%w: Client %d appears twice in the RedLock: each node counts once", ErrInvalid, i)
			return r
		}
		seen[c] = true
		m := newMutex(c, name)
		if m.checkErr != nil {
			r.checkErr = m.checkErr
			return r
		}
		r.nodes = append(r.nodes, m)
		r.order = append(r.order, i)
		ids = append(ids, c.id)
	}
	r.name = r.nodes[0].name // the first node's full name: errors and logs show it
	sort.Slice(r.order, func(a, b int) bool { return clients[r.order[a]].id < clients[r.order[b]].id })
	sort.Strings(ids)
	r.id = name + "\x00" + strings.Join(ids, "\x00")
	return r
}

// Name returns the lock's name as given to NewRedLock.
func (r *RedLock) Name() string {
	if r == nil {
		return ""
	}
	return r.given
}

// Quorum returns how many nodes must hold the lock: N/2+1.
func (r *RedLock) Quorum() int {
	if r == nil {
		return 0
	}
	return r.quorum
}

func (r *RedLock) usable() error {
	if r == nil {
		return fmt.Errorf("%w: nil redlock", ErrInvalid)
	}
	if err := r.handle.usable(); err != nil {
		return err
	}
	for _, c := range r.clients {
		if err := c.usable(); err != nil {
			return wrap(r.name, err)
		}
	}
	return nil
}

// Lock acquires the lock on a majority of its nodes, waiting as long as it
// takes or until ctx ends, and returns the context that holds it (see
// Mutex.Lock and the RedLock documentation for its token and its loss). If
// ctx holds the RedLock already, Lock re-enters it at once. The acquisition
// ends with ctx: it is released on every node as its final Unlock would, and
// an Unlock that comes later returns nil.
func (r *RedLock) Lock(ctx context.Context, opts ...LockOption) (context.Context, error) {
	return r.acquire(ctx, -1, opts)
}

// TryLock is Lock with a bounded wait: it gives up after wait with
// ErrNotAcquired. wait 0 makes exactly one attempt; a negative wait is an
// error (ErrInvalid).
func (r *RedLock) TryLock(ctx context.Context, wait time.Duration, opts ...LockOption) (context.Context, error) {
	if err := checkWait(r.Name(), wait); err != nil {
		return ctx, err
	}
	return r.acquire(ctx, wait, opts)
}

// timing returns the lease a RedLock acquisition is valid for (the shortest
// lease of its nodes: see nodeLease), each node call's timeout and the clock
// drift allowance.
func (r *RedLock) timing(lo lockOptions) (lease, nodeTimeout, drift time.Duration) {
	lease = lo.lease
	if lease <= 0 {
		for i, c := range r.clients {
			if i == 0 || c.opts.watchdogTimeout < lease {
				lease = c.opts.watchdogTimeout
			}
		}
	}
	nodeTimeout = min(max(lease/10, 50*time.Millisecond), time.Second)
	drift = lease/100 + 2*time.Millisecond
	return lease, nodeTimeout, drift
}

// nodeLease returns the lease of node i: the fixed lease when there is one,
// else the watchdog timeout of the node's Client, which renews it every third
// of that.
func (r *RedLock) nodeLease(i int, lo lockOptions) time.Duration {
	if lo.lease > 0 {
		return lo.lease
	}
	return r.clients[i].opts.watchdogTimeout
}

func (r *RedLock) acquire(ctx context.Context, wait time.Duration, opts []LockOption) (context.Context, error) {
	if err := r.usable(); err != nil {
		return ctx, err
	}
	if ctx == nil {
		return ctx, noContext(r.name)
	}
	// The Clients' own WithReplicaAck defaults do not apply: the nodes of
	// a RedLock are independent masters. Asking for it here is a mistake.
	var lo lockOptions
	for _, f := range opts {
		if f != nil {
			f(&lo)
		}
	}
	if lo.err != nil {
		return ctx, wrap(r.name, lo.err)
	}
	if lo.ack.replicas > 0 {
		return ctx, wrap(r.name, fmt.Errorf("%w: replica acknowledgement does not apply to a RedLock (its nodes are independent masters)", ErrInvalid))
	}
	if ctxend.Ended(ctx) {
		return ctx, ctxErr(r.name, ctx)
	}
	if rh, _ := ctx.Value(redKey{r.id}).(*redHold); rh != nil {
		rh.mu.Lock()
		ok := rh.levels > 0 && rh.ctx.Err() == nil
		if ok {
			rh.levels++
		}
		rh.mu.Unlock()
		if ok {
			return ctx, nil
		}
	}

	// A node whose lock ctx holds already (a Mutex of the name on that
	// node's Client) is re-entered; the others are taken afresh.
	p, err := enterParts(ctx, r.name, r.nodes, r.order, true)
	if err != nil {
		return ctx, err
	}
	defer p.exit()
	holds, carried := p.holds, p.carried

	lease, nodeTimeout, drift := r.timing(lo)
	var (
		start  time.Time
		taken  []bool
		token  fencing.Token
		split  bool
		leases = make([]any, len(r.clients))
	)
	for i := range r.clients {
		leases[i] = r.clients[i].leaseArg(r.nodeLease(i, lo))
	}
	try := func(ctx context.Context) (bool, time.Duration, error) {
		if split {
			// A split vote: wait a random moment so that contenders that
			// split the nodes between them do not collide again.
			pause := rand.N(min(lease/10, 50*time.Millisecond) + time.Millisecond)
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return false, 0, ctxErr(r.name, ctx)
			}
		}
		start = time.Now()
		res := r.each(ctx, nodeTimeout, func(ctx context.Context, i int) (any, error) {
			h := holds[i]
			n, err := r.clients[i].run(ctx, acquireScript, r.nodes[i].keys, leases[i], h.field, h.levels, r.clients[i].tokenTTL).Int64()
			return acquireReply(n), err
		})
		taken = make([]bool, len(r.clients))
		tokens := make([]fencing.Token, len(r.clients))
		var ok, failed int
		var errs []error
		retry := time.Duration(-1)
		for i, x := range res {
			if x.err != nil {
				failed++
				errs = append(errs, noted(fmt.Sprintf("node %d", i), unavailable(x.err)))
				continue
			}
			reply := x.val.(acquireReply)
			switch {
			case reply.token() > 0 || reply.reentered():
				taken[i] = true
				ok++
				tokens[i] = reply.token()
				if holds[i].levels > 0 {
					tokens[i] = holds[i].token
				}
			case reply.held():
				if d := retryAfter(r.clients[i], reply.pttl()); retry < 0 || d < retry {
					retry = d
				}
			default:
				// A node this owner held is gone: its hold is lost, and
				// the node counts as refused. Trying again at once would
				// find it gone again: the wait is for the other nodes.
				if h := holds[i]; r.clients[i].holds.lose(h) {
					h.end(lostError(h.name, "its hold was gone when a RedLock re-entered it"))
				}
			}
		}
		if ok >= r.quorum && lease-time.Since(start)-drift > 0 {
			token = 0
			for i := range taken {
				if taken[i] {
					token = max(token, tokens[i])
				}
			}
			if r.raise(ctx, nodeTimeout, taken, tokens, token) >= r.quorum && lease-time.Since(start)-drift > 0 {
				return true, 0, nil
			}
		}
		// Not enough: release every node that may have been taken.
		unknown := make([]bool, len(r.clients))
		for i, x := range res {
			unknown[i] = taken[i] || (x.err != nil && outcomeUnknown(x.err))
		}
		r.rollback(ctx, nodeTimeout, holds, unknown)
		split = ok > 0
		if ctxend.Ended(ctx) {
			return false, 0, ctxErr(r.name, ctx)
		}
		if failed > len(r.clients)-r.quorum {
			return false, 0, wrap(r.name, fmt.Errorf("%w: %d of %d nodes unreachable, %d needed: %w",
				ErrNoQuorum, failed, len(r.clients), r.quorum, errors.Join(errs...)))
		}
		if retry < 0 {
			retry = 0 // the majority was too slow, not refused: try again
		}
		return false, retry, nil
	}

	// The wait queues on the first node ctx does not hold already: the
	// waiters of a node it holds (a Mutex's, on that node's Client) may
	// wait for this very owner, and a RedLock behind them would wait for
	// itself. With a node held, the first attempt goes ahead of them.
	rw := &redWait{r: r}
	reentry := false
	for i := len(r.clients) - 1; i >= 0; i-- {
		if carried[i] {
			reentry = true
		} else {
			rw.home = i
		}
	}
	err = r.clients[rw.home].waitFor(ctx, waitSpec{
		name: r.name, channel: r.nodes[rw.home].unlockCh, wait: wait, lease: lease, try: try,
		subscribe: rw.subscribe, eager: reentry,
	})
	rw.close()
	if err != nil {
		return ctx, err
	}
	return r.hold(ctx, holds, carried, taken, token, lo, lease, drift, start), nil
}

// hold records the acquisition that took the nodes marked in taken.
func (r *RedLock) hold(base context.Context, holds []*hold, carried, taken []bool, token fencing.Token, lo lockOptions, lease, drift time.Duration, start time.Time) context.Context {
	rh := &redHold{compoundHold: compoundHold{levels: 1, holds: make([]*hold, len(holds)), carried: carried, token: token}}
	rctx := rh.begin(base)
	if lo.lease > 0 {
		rctx, rh.expire = context.WithDeadlineCause(rctx, start.Add(lease-drift),
			lostError(r.name, "its validity of "+(lease-drift).String()+" ran out"))
	}
	for i, h := range holds {
		if !taken[i] {
			continue
		}
		rh.holds[i] = h
		rh.alive++
		if h.levels > 0 {
			h.reentered(start)
			// The node's counter was raised to the RedLock's token,
			// above the tokens h reserved for handing its lock over.
			h.top = h.token
			continue
		}
		h.prepare(r.nodes[i], lo) // its lease is nodeLease(i, lo)
		h.token, h.top = token, 0
		r.clients[i].establish(base, h, start)
		h.tieToParent()
	}
	rh.watch(func(i int, cause error) {
		if !errors.Is(cause, ErrLost) && !errors.Is(cause, ErrReleased) {
			return // the caller's context ended: the RedLock's ends with it
		}
		rh.mu.Lock()
		rh.alive--
		alive := rh.alive
		rh.mu.Unlock()
		if alive < r.quorum {
			rh.cancel(wrap(r.name, because(ErrLost, fmt.Errorf("%w: %d of %d nodes left (node %d: %w)",
				ErrNoQuorum, alive, len(r.clients), i, cause))))
		}
	})
	return rh.publish(rctx, redKey{r.id}, rh, func() { r.parentEnded(rh) })
}

// parentEnded releases the RedLock acquisition rh because the context it was
// taken with ended, as its final Unlock would: the nodes it took release
// themselves (tieToParent); the levels it added to node locks that context
// held already are released here.
func (r *RedLock) parentEnded(rh *redHold) {
	rh.mu.Lock()
	final := rh.levels > 0
	rh.levels = 0
	rh.ended = rh.ended || final
	rh.mu.Unlock()
	if !final {
		return
	}
	for i, h := range rh.holds {
		if h == nil || !rh.carried[i] {
			continue
		}
		c := r.clients[i]
		c.holds.refAgain(h)
		_ = h.enter(context.Background())
		if c.holds.stillHeld(h) {
			ctx, cancel := c.backgroundContext(max(h.lease, time.Second))
			_ = c.releaseLevel(ctx, h)
			cancel()
		}
		h.leave()
		c.holds.unref(h)
	}
	rh.stopParts()
	if rh.expire != nil {
		rh.expire()
	}
}

// A nodeResult is the outcome of one node's call.
type nodeResult struct {
	val any
	err error
}

// each runs f for every node at once, each bounded by timeout, and waits for
// all of them.
func (r *RedLock) each(ctx context.Context, timeout time.Duration, f func(ctx context.Context, i int) (any, error)) []nodeResult {
	out := make([]nodeResult, len(r.clients))
	var wg sync.WaitGroup
	for i := range r.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v, err := f(nctx, i)
			out[i] = nodeResult{v, err}
		}()
	}
	wg.Wait()
	return out
}

// raise makes the token counters of the nodes taken at least t and returns
// how many taken nodes have such a counter now.
func (r *RedLock) raise(ctx context.Context, timeout time.Duration, taken []bool, tokens []fencing.Token, t fencing.Token) int {
	res := r.each(ctx, timeout, func(ctx context.Context, i int) (any, error) {
		if !taken[i] || tokens[i] >= t {
			return nil, nil
		}
		return nil, r.clients[i].run(ctx, raiseTokenScript, r.nodes[i].keys[1:], int64(t), r.clients[i].tokenTTL).Err()
	})
	n := 0
	for i, x := range res {
		if taken[i] && x.err == nil {
			n++
		}
	}
	return n
}

// rollback undoes, on the nodes marked, the level an attempt added.
func (r *RedLock) rollback(ctx context.Context, timeout time.Duration, holds []*hold, marked []bool) {
	rctx := context.WithoutCancel(ctx)
	r.each(rctx, timeout, func(ctx context.Context, i int) (any, error) {
		if !marked[i] {
			return nil, nil
		}
		c := r.clients[i]
		return nil, c.run(ctx, releaseScript, r.nodes[i].relKeys, holds[i].field, holds[i].levels+1, c.publish).Err()
	})
}

// Unlock releases one level of the RedLock held by ctx; the final Unlock
// releases every node it holds, at once, and cancels the context with cause
// ErrReleased. A node that cannot be reached is left to expire with its
// lease (nothing renews it any more); so does the node of a Client closed
// meanwhile. Unlock returns ErrNotHeld when ctx does not hold the lock, and
// an error matching ErrLost when the lock had lost its majority.
func (r *RedLock) Unlock(ctx context.Context) error {
	if r == nil {
		return fmt.Errorf("%w: nil redlock", ErrInvalid)
	}
	if r.checkErr != nil {
		return wrap(r.name, r.checkErr)
	}
	// A closed Client's node was given up when it closed (it counts as
	// lost); the others are still released.
	if ctx == nil {
		return noContext(r.name)
	}
	rh, _ := ctx.Value(redKey{r.id}).(*redHold)
	if rh == nil {
		if errors.Is(context.Cause(ctx), ErrLost) {
			return wrap(r.name, ErrLost)
		}
		return wrap(r.name, ErrNotHeld)
	}
	rh.mu.Lock()
	if rh.levels == 0 {
		ended := rh.ended
		rh.mu.Unlock()
		if ended {
			return nil // released when the context it was taken with ended
		}
		return wrap(r.name, ErrNotHeld)
	}
	rh.levels--
	final := rh.levels == 0
	rh.mu.Unlock()
	if !final {
		return nil
	}
	rh.stopWatching()
	_, timeout, _ := r.timing(lockOptions{})
	var wg sync.WaitGroup
	for i, h := range rh.holds {
		if h == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.clients[i]
			_ = h.enter(context.Background())
			defer h.leave()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			defer cancel()
			err := c.releaseLevel(rctx, h)
			if err != nil && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotHeld) {
				// Unreachable: stop renewing it; it expires with its lease.
				if c.holds.lose(h) {
					h.end(wrap(r.name, ErrReleased))
				}
				c.opts.logger.WarnContext(ctx, "lock: could not release a RedLock node; it expires with its lease",
					"lock", r.name, "node", i, "err", err)
			}
		}()
	}
	wg.Wait()
	rh.cancel(wrap(r.name, ErrReleased))
	if rh.expire != nil {
		rh.expire()
	}
	if cause := context.Cause(rh.ctx); errors.Is(cause, ErrLost) {
		return cause
	}
	return nil
}

// A redWait is the subscription side of one RedLock wait: the waiter waits
// in the queue of its home node's Client, and an unlock on any node wakes
// it.
type redWait struct {
	r       *RedLock
	home    int        // the client index whose queue the wait is in
	subs    []*chanSub // by client index; [home] unused (the queue's own)
	relayed []bool
}

// subscribe subscribes the unlock channel on every node it can reach within
// a node timeout. A node that cannot be reached is skipped: its unlock
// messages are missed, which the wait's bound covers.
func (w *redWait) subscribe(ctx context.Context, q *waitQueue, deadline <-chan time.Time) error {
	r := w.r
	c0 := r.clients[w.home]
	if w.subs == nil {
		w.subs = make([]*chanSub, len(r.clients))
		w.relayed = make([]bool, len(r.clients))
	}
	c0.qmu.Lock()
	if q.sub == nil {
		q.sub = c0.subs.acquire(q.channel)
	}
	all := []*chanSub{q.sub}
	c0.qmu.Unlock()
	for i, c := range r.clients {
		if i == w.home {
			continue
		}
		if w.subs[i] == nil {
			w.subs[i] = c.subs.acquire(r.nodes[i].unlockCh)
		}
		if !w.relayed[i] {
			c.addRelay(r.nodes[i].unlockCh, relay{to: c0, channel: q.channel})
			w.relayed[i] = true
		}
		all = append(all, w.subs[i])
	}
	_, timeout, _ := r.timing(lockOptions{})
	timer := time.NewTimer(timeout)
	defer timer.Stop()
wait:
	for _, s := range all {
		select {
		case <-s.ready:
		case <-timer.C:
			break wait
		case <-deadline:
			return notAcquired(ctx, r.name)
		case <-ctx.Done():
			return ctxErr(r.name, ctx)
		}
	}
	// Drop failed subscriptions, so that the next attempt subscribes anew.
	c0.qmu.Lock()
	var drop *chanSub
	if s := q.sub; s != nil && isDone(s.ready) && s.err != nil {
		drop, q.sub = s, nil
	}
	c0.qmu.Unlock()
	if drop != nil {
		c0.subs.release(drop)
	}
	for i := range r.clients {
		if s := w.subs[i]; i != w.home && isDone(s.ready) && s.err != nil {
			r.clients[i].subs.release(s)
			w.subs[i] = nil
		}
	}
	return nil
}

// close ends the subscriptions and relays of the wait.
func (w *redWait) close() {
	home := relay{to: w.r.clients[w.home], channel: w.r.nodes[w.home].unlockCh}
	for i := range w.subs {
		if i == w.home {
			continue
		}
		c := w.r.clients[i]
		if w.subs[i] != nil {
			c.subs.release(w.subs[i])
		}
		if w.relayed[i] {
			c.removeRelay(w.r.nodes[i].unlockCh, home)
		}
	}
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

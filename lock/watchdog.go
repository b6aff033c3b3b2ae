package lock

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// renewChunk is how many locks one renewal script call extends.
	renewChunk = 512
	// renewCallsPerRoundTrip is how many renewal script calls share one
	// pipelined round trip.
	renewCallsPerRoundTrip = 64
)

// The watchdog renews every lock its Client holds without a fixed lease: one
// loop per Client, not a goroutine per lock. Every timeout/3 it extends all
// of them in batches — one script call per renewChunk locks of one hash slot,
// pipelined — and a lock found gone cancels its holder's context with ErrLost
// at once. When Redis cannot be reached the renewals are retried until a
// lock's lease would have run out; then that lock is declared lost too.
type watchdog struct {
	c      *Client
	period time.Duration

	mu      sync.Mutex
	holds   map[*hold]struct{}
	running bool
	kick    chan struct{} // capacity 1: the first hold arrived
}

func newWatchdog(c *Client) *watchdog {
	return &watchdog{
		c:      c,
		period: c.opts.watchdogTimeout / 3,
		holds:  make(map[*hold]struct{}),
		kick:   make(chan struct{}, 1),
	}
}

// add starts renewing h, whose lease runs until until.
func (w *watchdog) add(h *hold, until time.Time) {
	w.mu.Lock()
	h.renewedUntil = until
	w.holds[h] = struct{}{}
	start := !w.running
	if start {
		w.running = w.c.goBackground(w.loop)
	}
	w.mu.Unlock()
	if !start {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// remove stops renewing h and returns when no renewal of h is pending any
// more in this process. It reports whether h was being renewed.
func (w *watchdog) remove(h *hold) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.holds[h]
	delete(w.holds, h)
	return ok
}

// len returns the number of holds being renewed.
func (w *watchdog) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.holds)
}

func (w *watchdog) loop() {
	t := time.NewTimer(w.period)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.c.done:
			return
		}
		next := w.renew()
		if next < 0 {
			select {
			case <-w.kick:
			case <-w.c.done:
				return
			}
			next = w.period
		}
		t.Reset(next)
	}
}

// renew extends every hold once and returns when to run again (<0: nothing
// is held; wait for the next hold).
func (w *watchdog) renew() time.Duration {
	w.mu.Lock()
	if len(w.holds) == 0 {
		w.mu.Unlock()
		return -1
	}
	all := make([]*hold, 0, len(w.holds))
	for h := range w.holds {
		all = append(all, h)
	}
	w.mu.Unlock()

	chunks := w.chunk(all)
	ctx, cancel := w.c.backgroundContext(w.period)
	defer cancel()
	sent := time.Now()
	cmds := w.send(ctx, chunks)
	now := time.Now()
	leaseEnd := sent.Add(w.c.opts.watchdogTimeout)

	next := w.period
	type loss struct {
		h   *hold
		why string
	}
	var lost []loss
	w.mu.Lock()
	for i, chunk := range chunks {
		vals, err := cmds[i].Int64Slice()
		for j, h := range chunk {
			if _, ok := w.holds[h]; !ok {
				continue // released or lost meanwhile
			}
			switch {
			case err == nil && j < len(vals) && vals[j] == 1:
				h.renewedUntil = leaseEnd
			case err == nil:
				lost = append(lost, loss{h, "the watchdog found it gone"})
			case !now.Before(h.renewedUntil):
				lost = append(lost, loss{h, "renewals failed until its lease ran out: " + err.Error()})
			default:
				retry := max(w.period/8, 10*time.Millisecond)
				next = min(next, retry, h.renewedUntil.Sub(now))
			}
		}
	}
	w.mu.Unlock()
	if len(lost) > 0 {
		w.c.opts.logger.Debug("lock: watchdog found locks lost", "count", len(lost))
	}
	for _, l := range lost {
		if w.c.lose(l.h) {
			l.h.end(lostError(l.h.name, l.why))
		}
	}
	return max(next, time.Millisecond)
}

// chunk groups holds by hash slot (Cluster) and splits the groups into
// script calls of at most renewChunk locks.
func (w *watchdog) chunk(all []*hold) [][]*hold {
	var groups [][]*hold
	if w.c.cluster {
		bySlot := make(map[int][]*hold)
		for _, h := range all {
			s := slot(h.id.key)
			bySlot[s] = append(bySlot[s], h)
		}
		slots := make([]int, 0, len(bySlot))
		for s := range bySlot {
			slots = append(slots, s)
		}
		sort.Ints(slots)
		for _, s := range slots {
			groups = append(groups, bySlot[s])
		}
	} else {
		groups = [][]*hold{all}
	}
	var chunks [][]*hold
	for _, g := range groups {
		for len(g) > renewChunk {
			chunks = append(chunks, g[:renewChunk])
			g = g[renewChunk:]
		}
		chunks = append(chunks, g)
	}
	return chunks
}

// send runs the renewal script once per chunk, pipelined
// renewCallsPerRoundTrip calls at a time. A server that lost its script cache
// gets the script loaded once and the failed calls again.
func (w *watchdog) send(ctx context.Context, chunks [][]*hold) []*redis.Cmd {
	lease := strconv.FormatInt(w.c.opts.watchdogTimeout.Milliseconds(), 10)
	cmds := make([]*redis.Cmd, len(chunks))
	exec := func(idx []int) {
		for len(idx) > 0 {
			n := min(len(idx), renewCallsPerRoundTrip)
			pipe := w.c.rdb.Pipeline()
			for _, i := range idx[:n] {
				keys := make([]string, len(chunks[i]))
				args := make([]any, 1+len(chunks[i]))
				args[0] = lease
				for j, h := range chunks[i] {
					keys[j], args[j+1] = h.id.key, h.field
				}
				cmds[i] = renewScript.EvalSha(ctx, pipe, keys, args...)
			}
			_, _ = pipe.Exec(ctx)
			idx = idx[n:]
		}
	}
	all := make([]int, len(chunks))
	for i := range all {
		all[i] = i
	}
	exec(all)
	var again []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 && renewScript.Load(ctx, w.c.rdb).Err() == nil {
		exec(again)
	}
	return cmds
}

// isNoScript reports whether err is Redis' NOSCRIPT reply.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"time"
)

// A scenario is one contended run shape.
type scenario struct {
	id    string // key in the results
	group string // its -scenarios group
	title string
	ld    load
	cpu   bool // the critical section is empty, so process CPU is the libraries' own
}

const hotHold = 200 * time.Microsecond

// contendedScenarios returns the contended runs, timed as cfg says.
func contendedScenarios(cfg config) []scenario {
	l := func(goroutines, keys int, hold time.Duration) load {
		return load{clients: 4, goroutines: goroutines, keys: keys, hold: hold,
			warmup: cfg.warmup, duration: cfg.duration, drain: cfg.drain}
	}
	return []scenario{
		{"hot0", "hot", "One hot key, 4 Clients × 16 goroutines, empty critical section", l(16, 1, 0), true},
		{"hot200", "hot", "One hot key, 4 Clients × 16 goroutines, 200 µs critical section", l(16, 1, hotHold), false},
		{"hot2ms", "hot", "One hot key, 4 Clients × 16 goroutines, 2 ms critical section", l(16, 1, 2*time.Millisecond), false},
		{"keys64", "keys", "64 keys (each acquisition picks one at random), 4 Clients × 16 goroutines, 200 µs critical section", l(16, 64, hotHold), false},
		{"w16", "waiters", "", l(4, 1, hotHold), false},
		{"w256", "waiters", "", l(64, 1, hotHold), false},
		{"w1024", "waiters", "", l(256, 1, hotHold), false},
	}
}

// waiterColumns maps the waiter-scaling columns (goroutines in all, over 4
// Clients) to the scenario that measured them; 64 is the hot key at 200 µs.
var waiterColumns = []struct {
	goroutines int
	id         string
}{{16, "w16"}, {64, "hot200"}, {256, "w256"}, {1024, "w1024"}}

// results holds every measured value by scenario, row and metric, one per round.
type results struct {
	v     map[string][]float64
	notes []string
	// commands Redis ran per acquisition, by name, by scenario and row (last round)
	breakdown map[string]map[string]map[string]float64
	// HTTP runs: the answers, summed over rounds, by scenario and row (key(id, row, ""))
	answers   map[string]map[string]int
	httpSetup string // how the HTTP runs were set up, for the report
	// the hot-key figure's scenario: every wait of every round, by row
	waits map[string]*waitSample
}

// waitSample is the waits of one row of a contended scenario, every round's
// pooled.
type waitSample struct {
	ended []time.Duration // the waits that ended (the lock acquired)
	cut   []time.Duration // the waits still going on when the drain ended, at their length then
}

func newResults() *results {
	return &results{v: map[string][]float64{}, breakdown: map[string]map[string]map[string]float64{}, answers: map[string]map[string]int{},
		waits: map[string]*waitSample{}}
}

// keepWaits adds a run's waits to its row's sample: waits holds every wait,
// the cut ones included, and cut those alone; both sorted.
func (r *results) keepWaits(row string, waits, cut []time.Duration) {
	s := r.waits[row]
	if s == nil {
		s = &waitSample{}
		r.waits[row] = s
	}
	// waits less cut, both sorted: a merge.
	j := 0
	for _, w := range waits {
		if j < len(cut) && w == cut[j] {
			j++
			continue
		}
		s.ended = append(s.ended, w)
	}
	s.cut = append(s.cut, cut...)
}

func key(scenario, row, metric string) string { return scenario + "|" + row + "|" + metric }

func (r *results) add(scenario, row, metric string, v float64) {
	k := key(scenario, row, metric)
	r.v[k] = append(r.v[k], v)
}

func (r *results) get(scenario, row, metric string) []float64 { return r.v[key(scenario, row, metric)] }

func (r *results) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func (r *results) keepBreakdown(scenario, row string, by map[string]int64, per float64) {
	if per <= 0 {
		return
	}
	if r.breakdown[scenario] == nil {
		r.breakdown[scenario] = map[string]map[string]float64{}
	}
	m := map[string]float64{}
	for name, n := range by {
		m[name] = float64(n) / per
	}
	r.breakdown[scenario][row] = m
}

// measure runs every selected scenario for every contender, round after
// round, the contenders' order rotated each round so that none always runs
// first or last.
func measure(ctx context.Context, e *env, cfg config, log io.Writer) (*results, error) {
	cs := contenders()
	r := newResults()
	var h *httpEnv
	if cfg.scenarios["http"] {
		var err error
		if h, err = startHTTP(ctx, cfg.httpDB, log); err != nil {
			return nil, fmt.Errorf("the HTTP runs: %w", err)
		}
		defer h.close()
		r.httpSetup = h.dbServer
	}
	seq := 0
	name := func(what string) string {
		seq++
		return "bench:" + what + ":" + strconv.Itoa(seq)
	}
	for round := range cfg.rounds {
		order := rotate(cs, round)
		// The contended runs rotate their own list: rotating every
		// contender and dropping the uncontended-only ones would repeat
		// an order before each had run first.
		contendedOrder := rotate(lockers(cs), round)
		tag := fmt.Sprintf("[round %d/%d]", round+1, cfg.rounds)
		after := func(c contender, what string, err error) error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				r.note("round %d, %s, %s: %v", round+1, what, c.name, err)
				fmt.Fprintf(log, "%s %s %s: error: %v\n", tag, what, c.name, err)
			}
			return e.reset(ctx)
		}

		if cfg.scenarios["uncontended"] {
			// The uncontended times are the most sensitive to other work:
			// let the previous round's aftermath end first.
			waited, quiet, err := settle(ctx, 15*time.Second)
			if err != nil {
				return nil, err
			}
			if !quiet {
				r.note("round %d: the machine was still busy (more than a tenth of a core) after %v when the uncontended runs started", round+1, waited.Round(time.Second))
			}
			fmt.Fprintf(log, "%s settled in %v (quiet: %v)\n", tag, waited.Round(10*time.Millisecond), quiet)
			stopBusy := func() {}
			if cfg.busy {
				if stopBusy, err = startBusyLoops(runtime.NumCPU()); err != nil {
					return nil, err
				}
			}
			us, err := runUncontended(ctx, e, order, cfg.uncontended, cfg.blocks, name("uncontended"))
			stopBusy()
			if err == nil {
				for _, c := range cs {
					u := us[c.name]
					r.addUncontended(c, u)
					fmt.Fprintf(log, "%s uncontended %-20s p50 %6.1f µs per Lock+Unlock\n", tag, c.name, percentile(u.cycles, 50)/1e3)
				}
				r.addVsFloor(cs, us)
			}
			if err := after(contender{name: "every library"}, "uncontended", err); err != nil {
				return nil, err
			}
		}

		for _, sc := range contendedScenarios(cfg) {
			if !cfg.scenarios[sc.group] {
				continue
			}
			for _, c := range contendedOrder {
				x, err := runContended(ctx, e, c, sc.ld, name(sc.id))
				if err == nil {
					r.addContended(sc, c, x)
					fmt.Fprintf(log, "%s %-7s %-20s %7.0f acq/s  wait p99 %8.2f ms  Redis ran %5.1f cmds/acq\n",
						tag, sc.id, c.name, float64(x.acquisitions)/x.window.Seconds(),
						percentile(x.waits, 99)/1e6, float64(x.cost.executed)/float64(max(x.acquisitions, 1)))
				}
				if err := after(c, sc.id, err); err != nil {
					return nil, err
				}
			}
		}

		if cfg.scenarios["handoff"] {
			for _, c := range contendedOrder {
				h, err := runHandoff(ctx, e, c, cfg.handoffs, name("handoff"))
				if err == nil {
					r.add("handoff", c.name, "p50", percentile(h, 50)/1e6)
					r.add("handoff", c.name, "p90", percentile(h, 90)/1e6)
					r.add("handoff", c.name, "max", float64(h[len(h)-1])/1e6)
					fmt.Fprintf(log, "%s handoff %-20s p50 %7.2f ms\n", tag, c.name, percentile(h, 50)/1e6)
				}
				if err := after(c, "handoff", err); err != nil {
					return nil, err
				}
			}
		}

		if cfg.scenarios["held"] && round < cfg.heldRounds {
			for _, n := range cfg.held {
				// Three renewal periods and a half: three whole passes.
				h, err := runHeld(ctx, e, n, cfg.watchdog, cfg.watchdog+cfg.watchdog/6, name("held"))
				if err == nil {
					r.addHeld(h, cfg.watchdog)
					fmt.Fprintf(log, "%s held %7d locks: %d round trips in %v, +%d goroutines, %.0f B heap per lock\n",
						tag, n, h.roundTrips, h.window.Round(time.Millisecond), h.goroutines, float64(h.heap)/float64(n))
				}
				if err := after(contender{name: "seckillguard"}, fmt.Sprintf("held %d", n), err); err != nil {
					return nil, err
				}
			}
		}

		if h != nil {
			if err := measureHTTP(ctx, h, cfg, r, round, log, tag); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// rotate returns cs started at its (round mod len)th element.
func rotate(cs []contender, round int) []contender {
	k := round % len(cs)
	return append(append([]contender(nil), cs[k:]...), cs[:k]...)
}

func (r *results) addUncontended(c contender, u uncontended) {
	n := float64(len(u.cycles))
	r.add("unc", c.name, "us", percentile(u.cycles, 50)/1e3)
	r.add("unc", c.name, "mean", float64(u.cost.elapsed.Nanoseconds())/1e3/n)
	r.add("unc", c.name, "sent", float64(u.cost.sent)/n)
	r.add("unc", c.name, "exec", float64(u.cost.executed)/n)
	r.add("unc", c.name, "cpu", float64(u.cost.cpu.Nanoseconds())/1e3/n)
	r.add("unc", c.name, "rcpu", float64(u.cost.redisCPU.Nanoseconds())/1e3/n)
	r.add("unc", c.name, "outside", percentile(u.outside, 50)/1e3)
	r.add("unc", c.name, "script", float64(u.cost.script.Nanoseconds())/1e3/n)
	r.add("unc", c.name, "allocs", float64(u.cost.mallocs)/n)
	r.add("unc", c.name, "bytes", float64(u.cost.bytes)/n)
	r.keepBreakdown("unc", c.name, u.cost.byCommand, n)
}

// addVsFloor records, for the round just measured, each contender's
// uncontended time relative to the floor's ("vsfloor") and to the contract
// floor's ("vscontract"): the median over the blocks of the ratio of its
// block's median cycle to the reference's in the same block (they ran one
// right after the other). The speed of this machine drifts by up to 2× over
// seconds, with nothing visible running in it; a ratio of neighbours is
// steady where a ratio of whole-round medians is not.
func (r *results) addVsFloor(cs []contender, us map[string]uncontended) {
	for _, ref := range []struct{ name, metric string }{{"floor", "vsfloor"}, {"floor (contract)", "vscontract"}} {
		floor, ok := us[ref.name]
		if !ok {
			continue
		}
		for _, c := range cs {
			u := us[c.name]
			if len(u.blocks) != len(floor.blocks) || len(u.blocks) == 0 {
				continue
			}
			ratios := make([]float64, len(u.blocks))
			for b := range u.blocks {
				ratios[b] = float64(u.blocks[b]) / float64(floor.blocks[b])
			}
			r.add("unc", c.name, ref.metric, (median(ratios)-1)*100)
		}
	}
}

func (r *results) addContended(sc scenario, c contender, x contended) {
	id, lib := sc.id, c.name
	n := float64(x.acquisitions)
	r.add(id, lib, "acq/s", n/x.window.Seconds())
	r.add(id, lib, "p50", percentile(x.waits, 50)/1e6)
	r.add(id, lib, "p99", percentile(x.waits, 99)/1e6)
	r.add(id, lib, "p99served", percentile(x.served, 99)/1e6)
	maxWait := math.NaN()
	if len(x.waits) > 0 {
		maxWait = float64(x.waits[len(x.waits)-1]) / 1e6
	}
	r.add(id, lib, "max", maxWait)
	r.add(id, lib, "cut", float64(x.censored))
	r.add(id, lib, "unserved", float64(x.unserved))
	if n > 0 && len(x.perClient) > 1 {
		lo, hi := slices.Min(x.perClient), slices.Max(x.perClient)
		r.add(id, lib, "shareLo", float64(lo)/n*100)
		r.add(id, lib, "shareHi", float64(hi)/n*100)
	}
	if n > 0 {
		r.add(id, lib, "sent", float64(x.cost.sent)/n)
		r.add(id, lib, "exec", float64(x.cost.executed)/n)
		r.add(id, lib, "rcpu", float64(x.cost.redisCPU.Nanoseconds())/1e3/n)
		r.add(id, lib, "allocs", float64(x.cost.mallocs)/n)
		if sc.cpu {
			r.add(id, lib, "cpu", float64(x.cost.cpu.Nanoseconds())/1e3/n)
		}
		r.keepBreakdown(id, lib, x.cost.byCommand, n)
	}
	if x.errors > 0 {
		r.note("%s, %s: %d lock or unlock calls failed", id, lib, x.errors)
	}
	if id == hotFigureScenario {
		r.keepWaits(lib, x.waits, x.cut)
	}
}

func (r *results) addHeld(h held, watchdog time.Duration) {
	row := strconv.Itoa(h.n)
	sec := h.window.Seconds()
	r.add("held", row, "acquire", h.acquire.Seconds())
	r.add("held", row, "goroutines", float64(h.goroutines))
	r.add("held", row, "heapMB", float64(h.heap)/(1<<20))
	r.add("held", row, "heapPer", float64(h.heap)/float64(h.n))
	r.add("held", row, "rtps", float64(h.roundTrips)/sec)
	r.add("held", row, "expected", float64(expectedRoundTrips(h.n))/(watchdog/3).Seconds())
	if h.passes > 0 {
		r.add("held", row, "rtpass", float64(h.roundTrips)/float64(h.passes))
		r.add("held", row, "passms", float64(h.busy.Microseconds())/1e3/float64(h.passes))
	}
	r.add("held", row, "callsps", float64(h.scriptCalls)/sec)
	r.add("held", row, "renewedps", float64(h.renewed)/sec)
	r.add("held", row, "lostTaking", float64(h.lostTaking))
	r.add("held", row, "lost", float64(h.lost))
	if h.lost > 0 {
		r.note("held %d: %d locks were lost, %d of them before the last was taken (first cause: %s); lease %v", h.n, h.lost, h.lostTaking, h.lostWhy, watchdog)
	}
	if h.single > 0 {
		r.note("held %d: %d non-pipelined commands were sent while the locks were only held", h.n, h.single)
	}
}

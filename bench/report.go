package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// machine describes where and how a report was measured.
type machine struct {
	cpus    int
	model   string
	redis   string
	goVer   string
	took    time.Duration
	command string
	date    string

	loadStart, loadEnd string  // 1-minute load average
	loadMean, loadMax  float64 // of the 1-minute load average, sampled every 5 s during the run
	revision           string  // the commit of the framework measured
}

// revision names the commit of the framework the benchmark is built with
// (the module is replaced by the parent directory), and says so when the
// packages it measures have changes not committed. Called when the run
// starts: the code measured is the code of that moment (go run compiled the
// lock runs just before; the HTTP runs' service is built right after).
func revision() string {
	out, err := exec.Command("git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown commit"
	}
	rev := "commit " + strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--", "lock", "fencing", "guard", "ginmw", "gormplugin", "example-seckill").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		rev += " with uncommitted changes in lock/, fencing/, guard/, ginmw/, gormplugin/ or example-seckill/"
	}
	return rev
}

// loadAverage returns the 1-minute load average, "?" when unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func describeMachine(ctx context.Context, admin *redis.Client) (machine, error) {
	m := machine{cpus: runtime.NumCPU(), model: "unknown CPU", goVer: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		date: time.Now().UTC().Format("2006-01-02")}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	info, err := admin.Info(ctx, "server").Result()
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			m.redis = v
		}
	}
	return m, nil
}

// num formats v with about three significant digits.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "—"
	case a >= 100 || a == 0:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// stats returns the median, minimum and maximum of vs, NaNs left out.
func stats(vs []float64) (med, lo, hi float64, ok bool) {
	var s []float64
	for _, v := range vs {
		if !math.IsNaN(v) {
			s = append(s, v)
		}
	}
	if len(s) == 0 {
		return 0, 0, 0, false
	}
	sort.Float64s(s)
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1], true
}

// median returns the median of vs, NaN when there is none.
func median(vs []float64) float64 {
	m, _, _, ok := stats(vs)
	if !ok {
		return math.NaN()
	}
	return m
}

// cell formats vs as "median (min–max)", or the median alone when the rounds
// agree or there was one.
func cell(vs []float64, unit string) string {
	med, lo, hi, ok := stats(vs)
	if !ok {
		return "—"
	}
	s := num(med) + unit
	if l, h := num(lo), num(hi); l != h {
		s += " (" + l + "–" + h + ")"
	}
	return s
}

type table struct {
	w    io.Writer
	cols []string
}

func newTable(w io.Writer, cols ...string) *table {
	fmt.Fprintf(w, "| %s |\n|", strings.Join(cols, " | "))
	for i := range cols {
		if i == 0 {
			fmt.Fprint(w, " --- |")
		} else {
			fmt.Fprint(w, " ---: |")
		}
	}
	fmt.Fprintln(w)
	return &table{w: w, cols: cols}
}

func (t *table) row(cells ...string) { fmt.Fprintf(t.w, "| %s |\n", strings.Join(cells, " | ")) }

// writeReport writes the markdown report.
func writeReport(w io.Writer, cfg config, m machine, r *results) error {
	cs := contenders()
	fmt.Fprintf(w, "Measured %s on %d × %s (nproc %d), redis-server %s (its own, started by the run), %s; %d rounds; the run took %v. Load average (1 min) at the start %s, at the end %s; sampled every 5 s during the run: mean %.2f, max %.2f.\n\n",
		m.date, m.cpus, m.model, m.cpus, m.redis, m.goVer, cfg.rounds, m.took.Round(time.Second), m.loadStart, m.loadEnd, m.loadMean, m.loadMax)
	fmt.Fprintf(w, "Command: `%s` (seckillguard at %s).\n\n", m.command, m.revision)
	fmt.Fprintf(w, "Each cell: the median over rounds, (min–max over rounds) when they differ. The libraries run one after another in every scenario of a round, in an order rotated each round.\n\n")

	if cfg.scenarios["uncontended"] {
		busy := ""
		if cfg.busy {
			busy = fmt.Sprintf(" With -busy: while these runs went on, %d processes looped at nice 19, one per CPU, so that no round trip waited for an idle vCPU to wake; client CPU includes none of theirs, Redis CPU is redis-server's alone.", runtime.NumCPU())
		}
		fmt.Fprintf(w, "### Uncontended Lock+Unlock\n\nOne goroutine locks and unlocks a lock nobody else uses, %d times per library and round, in %d blocks: the libraries take turns block by block. Time of one Lock+Unlock: the median cycle (robust to noise from elsewhere on the machine) and the mean; \"vs floor\" is, within each round, the median over the blocks of the ratio of the library's median cycle to the floor's in the same block, and \"vs floor (contract)\" the same against the contract floor, which leaves what a library adds to the contract's Redis work. \"Outside go-redis\" is the median over cycles of a cycle's time less the time its commands spent in go-redis (writing, the round trip, Redis, reading; a hook times them): what the library's own code takes between and around its round trips. \"Redis script µs\" is what INFO commandstats counts for EVALSHA and EVAL: Redis running the scripts, without its network work.%s Per Lock+Unlock:\n\n", cfg.uncontended, cfg.blocks, busy)
		t := newTable(w, "library", "µs (median)", "µs (mean)", "vs floor", "vs floor (contract)", "µs outside go-redis (median)", "commands sent", "commands Redis ran", "client CPU µs", "Redis CPU µs", "Redis script µs", "allocs", "bytes")
		for _, c := range cs {
			g := func(metric string) []float64 { return r.get("unc", c.name, metric) }
			vs := func(metric, ref string) string { // signed; "—" on the reference's own row
				x := cell(g(metric), "%")
				switch {
				case c.name == ref:
					return "—"
				case strings.HasPrefix(x, "-") || x == "—":
					return x
				}
				return "+" + x
			}
			t.row(c.name, cell(g("us"), ""), cell(g("mean"), ""), vs("vsfloor", "floor"), vs("vscontract", "floor (contract)"), cell(g("outside"), ""), cell(g("sent"), ""), cell(g("exec"), ""), cell(g("cpu"), ""), cell(g("rcpu"), ""), cell(g("script"), ""), cell(g("allocs"), ""), cell(g("bytes"), ""))
		}
		fmt.Fprintln(w)
		writeBreakdown(w, "library", cs, r, "unc", "What Redis ran per Lock+Unlock (last round; a script call counts once as EVALSHA and once per command inside it)")
	}

	cs = lockers(cs) // the rest is under contention
	for _, sc := range contendedScenarios(cfg) {
		if !cfg.scenarios[sc.group] || sc.title == "" {
			continue
		}
		fmt.Fprintf(w, "### %s\n\nEvery goroutine locks, runs the critical section, unlocks, and locks again at once. Measured: a window of %v after %v of warm-up. Wait = from calling Lock to holding the lock; the waits are every wait going on at some time during the window, including those of goroutines waiting since the warm-up (the load goes on up to %v after the window for them to end). \"p99 of served waits\" counts only the waits of acquisitions made in the window, as a latency histogram of successful calls would: it hides the goroutines a lock starves.\n\n", sc.title, cfg.duration, cfg.warmup, cfg.drain)
		cols := []string{"library", "acquisitions/s", "wait p50 ms", "wait p99 ms", "wait max ms", "p99 of served waits ms", fmt.Sprintf("goroutines never served (of %d)", sc.ld.clients*sc.ld.goroutines), "commands sent / acq", "commands Redis ran / acq", "Redis CPU µs / acq", "allocs / acq"}
		if sc.cpu {
			cols = append(cols, "client CPU µs / acq")
		}
		t := newTable(w, cols...)
		for _, c := range cs {
			g := func(metric string) []float64 { return r.get(sc.id, c.name, metric) }
			cells := []string{c.name, cell(g("acq/s"), ""), cell(g("p50"), ""), cell(g("p99"), ""), cell(g("max"), ""), cell(g("p99served"), ""), cell(g("unserved"), ""), cell(g("sent"), ""), cell(g("exec"), ""), cell(g("rcpu"), ""), cell(g("allocs"), "")}
			if sc.cpu {
				cells = append(cells, cell(g("cpu"), ""))
			}
			t.row(cells...)
		}
		fmt.Fprintln(w)
		writeShares(w, cs, r, sc.id)
		writeCut(w, cs, r, sc.id)
		if sc.id == hotFigureScenario {
			if cfg.figures != "" {
				fmt.Fprintf(w, "![The waits of this scenario per library: the share of the waits ended within a time, on a log time axis and a percentile scale; the curves of the libraries that left waiters unserved stop short of 100%%](%s)\n\n", hotKeyFigure)
			}
			writeBreakdown(w, "library", cs, r, sc.id, "What Redis ran per acquisition (last round)")
		}
	}

	if cfg.scenarios["handoff"] {
		fmt.Fprintf(w, "### Handoff: unlock → the next holder in\n\nA holder in one instance unlocks while a waiter in another instance has been waiting for 5–25 ms; time from the start of Unlock to the waiter's Lock returning, %d handoffs per round.\n\n", cfg.handoffs)
		t := newTable(w, "library", "p50 ms", "p90 ms", "max ms")
		for _, c := range cs {
			t.row(c.name, cell(r.get("handoff", c.name, "p50"), ""), cell(r.get("handoff", c.name, "p90"), ""), cell(r.get("handoff", c.name, "max"), ""))
		}
		fmt.Fprintln(w)
	}

	if cfg.scenarios["waiters"] {
		fmt.Fprintf(w, "### Scaling with the number of waiting goroutines\n\nOne hot key, 200 µs critical section, the goroutines spread over 4 Clients (the 64 column is the hot-key run above).\n\n")
		for _, metric := range []struct{ id, title string }{
			{"acq/s", "Acquisitions per second"}, {"p99", "Wait p99, ms"}, {"exec", "Commands Redis ran per acquisition"}, {"rcpu", "Redis CPU µs per acquisition"},
		} {
			fmt.Fprintf(w, "%s:\n\n", metric.title)
			cols := []string{"library"}
			for _, wc := range waiterColumns {
				cols = append(cols, strconv.Itoa(wc.goroutines))
			}
			t := newTable(w, cols...)
			for _, c := range cs {
				cells := []string{c.name}
				for _, wc := range waiterColumns {
					cells = append(cells, cell(r.get(wc.id, c.name, metric.id), ""))
				}
				t.row(cells...)
			}
			fmt.Fprintln(w)
		}
		for _, wc := range waiterColumns {
			if wc.id != "hot200" {
				writeCut(w, cs, r, wc.id)
			}
		}
	}

	if cfg.scenarios["held"] && len(cfg.held) > 0 {
		fmt.Fprintf(w, "### Locks held at once by one Client (seckillguard only)\n\n")
		fmt.Fprintf(w, "One Client takes n locks (32 goroutines at a time) and holds them for %v with a watchdog timeout of %v (a renewal pass every %v). The window starts right after a renewal pass. The peers have no watchdog: renewing is the caller's job, one Extend/Refresh call per lock. Batching allows ⌈⌈n/%d⌉/%d⌉ round trips per pass (one renewal script call per %d locks, %d calls per pipelined round trip); \"expected\" is that many per renewal period. Passes start a period apart (a pass that takes longer delays the next), and a pass renews only the locks that are due, so the measured rate can be lower. Goroutines and heap are measured after a GC, the heap including the caller's slice of lock contexts.\n\n",
			cfg.watchdog+cfg.watchdog/6, cfg.watchdog, cfg.watchdog/3, renewChunk, renewCallsPerRoundTrip, renewChunk, renewCallsPerRoundTrip)
		t := newTable(w, "locks held", "taking them, s", "goroutines added", "heap added, MB", "heap per lock, B", "watchdog round trips/s", "expected by batching, /s", "round trips per pass", "renewal script calls/s", "locks renewed/s (PEXPIRE)", "time per pass, ms", "locks lost while taking them", "locks lost by the end")
		for _, n := range cfg.held {
			row := strconv.Itoa(n)
			g := func(metric string) []float64 { return r.get("held", row, metric) }
			t.row(row, cell(g("acquire"), ""), cell(g("goroutines"), ""), cell(g("heapMB"), ""), cell(g("heapPer"), ""), cell(g("rtps"), ""), cell(g("expected"), ""), cell(g("rtpass"), ""), cell(g("callsps"), ""), cell(g("renewedps"), ""), cell(g("passms"), ""), cell(g("lostTaking"), ""), cell(g("lost"), ""))
		}
		fmt.Fprintln(w)
	}

	if cfg.scenarios["http"] {
		writeHTTP(w, cfg, r)
	}

	writeTargets(w, cfg, r)

	fmt.Fprintf(w, "### The libraries as configured\n\n")
	for _, c := range contenders() {
		fmt.Fprintf(w, "- **%s**: %s.\n", c.name, c.config)
	}
	fmt.Fprintf(w, "\nEvery instance is its own go-redis v9 client (pool of %d connections, go-redis' default here); commands sent are counted by a go-redis hook on those clients (pub/sub connections are not hooked), commands Redis ran by the INFO commandstats delta, which counts a script call as EVALSHA and again each command the script runs. Client CPU is the process's (getrusage) and is shown only where the critical section is empty; allocations are runtime.MemStats.Mallocs deltas, the harness included (it allocates nearly nothing per acquisition).\n\n",
		10*runtime.GOMAXPROCS(0))
	if len(r.notes) > 0 {
		fmt.Fprintf(w, "### Notes from this run\n\n")
		for _, n := range r.notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// writeShares reports how evenly the instances shared the acquisitions.
func writeShares(w io.Writer, cs []contender, r *results, id string) {
	var parts []string
	for _, c := range cs {
		lo, hi := median(r.get(id, c.name, "shareLo")), median(r.get(id, c.name, "shareHi"))
		if !math.IsNaN(lo) {
			parts = append(parts, fmt.Sprintf("%s %.0f–%.0f%%", c.name, lo, hi))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "Share of the acquisitions taken by the least and the most served of the 4 Clients (medians; 25%% each would be even): %s.\n\n", strings.Join(parts, ", "))
	}
}

// writeCut reports waits cut short by the end of a run, which make p99 and
// max lower bounds for a library that starves some waiters.
func writeCut(w io.Writer, cs []contender, r *results, id string) {
	var parts []string
	for _, c := range cs {
		if med, _, hi, ok := stats(r.get(id, c.name, "cut")); ok && hi > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", c.name, cell([]float64{med}, "")))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "Waits of the %s window still going on when the drain ended (median per round; counted at their length so far, so for a library that lets waiters starve, p99 and max are lower bounds that grow with -duration and -drain): %s.\n\n", id, strings.Join(parts, ", "))
	}
}

// writeBreakdown writes the commands Redis ran by name, a row per contender
// (its first column headed first).
func writeBreakdown(w io.Writer, first string, cs []contender, r *results, id, title string) {
	b := r.breakdown[id]
	if len(b) == 0 {
		return
	}
	totals := map[string]float64{}
	for _, m := range b {
		for name, v := range m {
			totals[name] += v
		}
	}
	var names []string
	for name := range totals {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if totals[names[i]] != totals[names[j]] {
			return totals[names[i]] > totals[names[j]]
		}
		return names[i] < names[j]
	})
	fmt.Fprintf(w, "%s:\n\n", title)
	t := newTable(w, slices.Concat([]string{first}, names)...)
	for _, c := range cs {
		m, ok := b[c.name]
		if !ok {
			continue
		}
		cells := []string{c.name}
		for _, name := range names {
			if v, ok := m[name]; ok {
				cells = append(cells, num(v))
			} else {
				cells = append(cells, "")
			}
		}
		t.row(cells...)
	}
	fmt.Fprintln(w)
}

// writeTargets checks the "Done when" numbers of the lock core and benchmark
// issues against the medians.
func writeTargets(w io.Writer, cfg config, r *results) {
	cs := contenders()
	var peers []string
	for _, c := range cs {
		if c.peer {
			peers = append(peers, c.name)
		}
	}
	const ours = "seckillguard"
	verdict := func(ok bool) string {
		if ok {
			return "**met**"
		}
		return "**missed**"
	}
	best := func(id, metric string, lower bool) (string, float64) {
		name, v := "", math.NaN()
		for _, p := range peers {
			x := median(r.get(id, p, metric))
			if math.IsNaN(x) {
				continue
			}
			if math.IsNaN(v) || (lower && x < v) || (!lower && x > v) {
				name, v = p, x
			}
		}
		return name, v
	}
	fmt.Fprintf(w, "### Targets (medians)\n\nThe targets are the Mutex's; the FairMutex column is for reference (its verdict in brackets).\n\n")
	t := newTable(w, "target", "seckillguard", "peers / floor", "verdict", "seckillguard (fair)")
	const fair = "seckillguard (fair)"
	any := false
	if cfg.scenarios["hot"] {
		any = true
		p, v := best("hot200", "p99", true)
		o, f := median(r.get("hot200", ours, "p99")), median(r.get("hot200", fair, "p99"))
		t.row("one hot key (200 µs): p99 wait ≤ ⅓ of the better peer's (every wait, starved ones included)", num(o)+" ms", fmt.Sprintf("%s: %s ms (⅓ = %s ms)", p, num(v), num(v/3)), verdict(o <= v/3),
			fmt.Sprintf("%s ms [%s]", num(f), verdict(f <= v/3)))
		p, v = best("hot200", "p99served", true)
		o, f = median(r.get("hot200", ours, "p99served")), median(r.get("hot200", fair, "p99served"))
		t.row("the same, served waits only (blind to starvation)", num(o)+" ms", fmt.Sprintf("%s: %s ms (⅓ = %s ms)", p, num(v), num(v/3)), verdict(o <= v/3),
			fmt.Sprintf("%s ms [%s]", num(f), verdict(f <= v/3)))
		for _, m := range []struct{ id, what string }{{"exec", "commands Redis ran"}, {"sent", "commands sent"}} {
			p, v := best("hot200", m.id, true)
			o, f := median(r.get("hot200", ours, m.id)), median(r.get("hot200", fair, m.id))
			t.row("one hot key (200 µs): "+m.what+" per acquisition ≤ every peer's", num(o), fmt.Sprintf("fewest: %s, %s", p, num(v)), verdict(o <= v),
				fmt.Sprintf("%s [%s]", num(f), verdict(f <= v)))
		}
		o, f = median(r.get("hot200", ours, "exec")), median(r.get("hot200", fair, "exec"))
		t.row("one hot key (200 µs): Redis runs ≤ 8 commands per acquisition (lock core issue)", num(o), "—", verdict(o <= 8),
			fmt.Sprintf("%s [%s]", num(f), verdict(f <= 8)))
		p, v = best("hot200", "acq/s", false)
		o, f = median(r.get("hot200", ours, "acq/s")), median(r.get("hot200", fair, "acq/s"))
		t.row("one hot key (200 µs): throughput ≥ every peer's", num(o)+" acq/s", fmt.Sprintf("highest: %s, %s acq/s", p, num(v)), verdict(o >= v),
			fmt.Sprintf("%s acq/s [%s]", num(f), verdict(f >= v)))
	}
	if cfg.scenarios["uncontended"] {
		any = true
		o, f := median(r.get("unc", ours, "vsfloor")), median(r.get("unc", fair, "vsfloor"))
		what := "uncontended Lock+Unlock within 10% of the floor"
		if cfg.busy {
			what += " (-busy: no idle vCPU)"
		}
		t.row(what, fmt.Sprintf("%s µs (%+.1f%%)", num(median(r.get("unc", ours, "us"))), o),
			"floor: "+num(median(r.get("unc", "floor", "us")))+" µs", verdict(o <= 10),
			fmt.Sprintf("%s µs (%+.1f%%) [%s]", num(median(r.get("unc", fair, "us"))), f, verdict(f <= 10)))
		for _, ref := range []struct{ name, what string }{
			{"floor (Redisson)", "(reference) Redisson's layout alone, no client code: floor (Redisson) over the floor"},
			{"floor (contract)", "(reference) the contract's Redis work (Redisson's layout and the fencing token), no client code: floor (contract) over the floor"},
		} {
			if x := median(r.get("unc", ref.name, "vsfloor")); !math.IsNaN(x) {
				t.row(ref.what, "—", fmt.Sprintf("%s µs (%+.1f%%)", num(median(r.get("unc", ref.name, "us"))), x), "—", "—")
			}
		}
		if x := median(r.get("unc", "floor (scripts, context)", "vscontract")); !math.IsNaN(x) {
			t.row("(reference) the Mutex's own scripts and the least Go bookkeeping of a hold (a context with the hold and its token, a watchdog registration): floor (scripts, context) over floor (contract)", "—",
				fmt.Sprintf("%s µs (%+.1f%%)", num(median(r.get("unc", "floor (scripts, context)", "us"))), x), "—", "—")
		}
		if o, f := median(r.get("unc", ours, "vscontract")), median(r.get("unc", fair, "vscontract")); !math.IsNaN(o) {
			t.row("uncontended: what the library's own code adds, over floor (contract) in the same blocks, ≤ +5% (request-cost issue)", fmt.Sprintf("%+.1f%%", o), "—", verdict(o <= 5), fmt.Sprintf("%+.1f%% [%s]", f, verdict(f <= 5)))
		}
	}
	if cfg.scenarios["http"] {
		any = true
		// ratio is the median over rounds of a row's requests/s over none's
		// in the same round.
		ratio := func(shape, row string) float64 { return 1 + median(r.get(shape, row, "drps"))/100 }
		for _, x := range []struct {
			shape, row, what string
			min              float64
		}{
			{"http1024", "guard", "HTTP, 1,024 SKUs: requests/s, guard ÷ none ≥ 0.80 (request-cost issue)", 0.80},
			{"http1", "local", "(reference) HTTP, one SKU: requests/s, local (a process-wide sync.Mutex, no Redis: a lock that costs nothing) ÷ none, against the 0.60 asked of guard", 0.60},
			{"http1", "guard", "HTTP, one SKU: requests/s, guard ÷ none ≥ 0.60 (request-cost issue)", 0.60},
			{"http1024", "guard, with Idempotency-Key", "HTTP, 1,024 SKUs: requests/s, guard with Idempotency-Key ÷ none ≥ 0.70 (request-cost issue)", 0.70},
			{"http1", "guard-combine", "HTTP, one SKU: requests/s, guard-combine ÷ none ≥ 1.0 (combining issue)", 1.0},
		} {
			if v := ratio(x.shape, x.row); !math.IsNaN(v) {
				t.row(x.what, fmt.Sprintf("%.2f", v), "—", verdict(v >= x.min), "—")
			}
		}
		if d := median(r.get("http1", "guard-combine", "dp99")); !math.IsNaN(d) {
			t.row("HTTP, one SKU: p99 of guard-combine ≤ none's (combining issue)", fmt.Sprintf("%+.1f ms", d), "—", verdict(d <= 0), "—")
		}
		if d := median(r.get("http1024", "guard, with Idempotency-Key", "exec")) - median(r.get("http1024", "guard", "exec")); !math.IsNaN(d) {
			t.row("HTTP, 1,024 SKUs: Redis commands per idempotent request beyond the lock's ≤ 8 (request-cost issue)", num(d), "—", verdict(d <= 8), "—")
		}
	}
	if !any {
		t.row("(the hot-key, uncontended and HTTP scenarios were not run)", "", "", "", "")
	}
	fmt.Fprintln(w)
}

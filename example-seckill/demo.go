package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/guard"
	"github.com/seckillguard/seckillguard/lock"
)

// demoConfig is the demo's command line.
type demoConfig struct {
	instances   int
	buyers      int
	stock       int
	duration    time.Duration
	concurrency int
	repeat      float64
	modes       []Mode
	verbose     bool
	json        bool // the results as one JSON document on stdout, for scripts
	knobs
}

// demo runs one sale per mode on fresh instances and prints what the
// database holds afterwards.
func demo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	dc, err := parseDemo(args, stderr)
	if err != nil {
		return err
	}
	pol, _, err := dc.loadPolicies()
	if err != nil {
		return err
	}
	b, err := OpenBackends(getenv, dc.sqlite)
	if err != nil {
		return err
	}
	defer b.Close()
	b.Quiet()
	info := stdout
	if dc.json {
		info = stderr // stdout carries the JSON document only
	}
	results, err := runDemo(ctx, dc, b, pol, info, stderr)
	if err != nil {
		return err
	}
	if dc.json {
		return printJSON(stdout, dc, b, results)
	}
	printTable(stdout, results)
	return nil
}

func parseDemo(args []string, stderr io.Writer) (*demoConfig, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: example-seckill demo [flags]\n\nStarts -instances instances of the service on loopback ports, all on one\nRedis and one database, runs one sale per mode against them and prints what\nthe database holds afterwards. The modes:")
		for _, m := range allModes {
			fmt.Fprintln(fs.Output(), "  "+m.legend())
		}
		fmt.Fprintln(fs.Output(), "\nflags:")
		printFlags(fs.Output(), fs)
	}
	dc := &demoConfig{}
	fs.IntVar(&dc.instances, "instances", 3, "instances of the service, each with its own Redis client, database pool and gin engine")
	fs.IntVar(&dc.buyers, "buyers", 2000, "buyers per sale, each wanting one unit")
	fs.IntVar(&dc.stock, "stock", 100, "units on sale")
	fs.DurationVar(&dc.duration, "duration", 30*time.Second, "longest a sale may run; clicks not sent by then are dropped")
	fs.IntVar(&dc.concurrency, "concurrency", 64, "requests in flight at once")
	fs.Float64Var(&dc.repeat, "repeat", 0.2, "fraction of buyers who click twice (two requests at once, one Idempotency-Key)")
	modes := fs.String("modes", "none,local,guard,guard-lease,guard-combine", "the sales to run, in order")
	fs.BoolVar(&dc.verbose, "v", false, "also print each mode's answers")
	fs.BoolVar(&dc.json, "json", false, "print the results as one JSON document on stdout (the settings and progress go to stderr)")
	dc.register(fs, knobs{holdDelay: 20 * time.Millisecond, holdRate: 0.2, watchdog: lock.DefaultWatchdogTimeout})
	fs.Lookup("lease").Usage += " (default: half of -hold-delay, so that a paused holder loses its lock)"
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("demo: unexpected arguments %q", fs.Args())
	}
	for _, name := range strings.Split(*modes, ",") {
		m, err := parseMode(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		dc.modes = append(dc.modes, m)
	}
	if dc.lease == 0 {
		// Shorter than the pause: a paused holder loses its lock.
		dc.lease = max(dc.holdDelay/2, time.Millisecond)
	}
	switch {
	case dc.instances < 1 || dc.buyers < 1 || dc.stock < 0 || dc.concurrency < 1:
		return nil, fmt.Errorf("demo: want at least 1 instance, buyer and request in flight, and stock >= 0")
	case dc.repeat < 0 || dc.repeat > 1:
		return nil, fmt.Errorf("-repeat %v: want a fraction in [0, 1]", dc.repeat)
	case dc.duration <= 0:
		return nil, fmt.Errorf("-duration %v: must be positive", dc.duration)
	}
	if err := dc.check(); err != nil {
		return nil, err
	}
	return dc, nil
}

// modeResult is one row of the demo's table.
type modeResult struct {
	mode       Mode
	initial    int
	requests   int
	orders     int64 // from the database
	stockLeft  int   // from the database
	duplicates int64 // orders beyond one per user, from the database
	// Stale writes refused, from the instances' metrics.
	refusedLockLost, refusedFence float64
	locksLost                     float64
	elapsed                       time.Duration
	p50, p99                      time.Duration
	answers                       map[string]int
	unsent                        int
}

func (r modeResult) oversold() int64 { return max(0, r.orders-int64(r.initial)) }

// drift is initial - left - orders: units sold whose deduction was lost
// (negative), or units deducted without an order (positive).
func (r modeResult) drift() int64 { return int64(r.initial-r.stockLeft) - r.orders }

// runDemo prints the demo's settings and runs its sales.
func runDemo(ctx context.Context, dc *demoConfig, b *Backends, pol *guard.Policies, stdout, progress io.Writer) ([]modeResult, error) {
	admin, err := b.OpenDB()
	if err != nil {
		return nil, err
	}
	defer closeDB(admin)
	if err := migrate(ctx, admin); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "%d instances on loopback ports, each with its own Redis client,\ndatabase pool and gin engine\n", dc.instances)
	fmt.Fprintf(stdout, "Redis: %s\ndatabase: %s\n", b.Redis, b.Database)
	fmt.Fprintf(stdout, "per sale: %d units, %d buyers (%.0f%% click twice), %d requests in flight;\n",
		dc.stock, dc.buyers, dc.repeat*100, dc.concurrency)
	fmt.Fprintf(stdout, "hold-delay %v in %.0f%% of purchases; guard-lease lease %v\n\n",
		dc.holdDelay, dc.holdRate*100, dc.lease)

	run := make([]byte, 6)
	_, _ = rand.Read(run)
	var results []modeResult
	for _, mode := range dc.modes {
		r, err := runSale(ctx, dc, b, admin, pol, mode, hex.EncodeToString(run), progress)
		if err != nil {
			return results, fmt.Errorf("mode %s: %w", mode, err)
		}
		results = append(results, r)
		if ctx.Err() != nil {
			return results, ctx.Err()
		}
	}
	if dc.verbose {
		for _, r := range results {
			fmt.Fprintf(stdout, "%-12s answers: %s\n", r.mode, formatAnswers(r.answers))
		}
		fmt.Fprintln(stdout)
	}
	return results, nil
}

// runSale starts the instances of one mode, resets the mode's SKU through
// the service, lets the buyers loose, and reads the outcome back from the
// database.
func runSale(ctx context.Context, dc *demoConfig, b *Backends, admin *gorm.DB, pol *guard.Policies, mode Mode, run string, progress io.Writer) (modeResult, error) {
	log := slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg := dc.config(mode, pol, log)
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.stop() // every buyer has had an answer
		}
	}()
	urls := make([]string, 0, dc.instances)
	for range dc.instances {
		in, err := startInstance(ctx, b, cfg, "127.0.0.1:0", false)
		if err != nil {
			return modeResult{}, err
		}
		instances = append(instances, in)
		urls = append(urls, in.url)
	}
	client := newClient(dc.concurrency)
	defer client.CloseIdleConnections()

	sku := "demo-" + string(mode)
	if err := resetProduct(ctx, client, urls[0], sku, dc.stock); err != nil {
		return modeResult{}, err
	}
	s := &sale{
		urls: urls, sku: sku, buyers: dc.buyers, repeat: dc.repeat, concurrency: dc.concurrency,
		deadline: time.Now().Add(dc.duration), keyPrefix: run + "-" + string(mode),
		client: client, progress: newProgressBar(progress, string(mode)),
	}
	sr := s.run(ctx)
	if err := ctx.Err(); err != nil {
		return modeResult{}, err
	}

	r := modeResult{mode: mode, initial: dc.stock, requests: sr.requests, elapsed: sr.elapsed, answers: sr.answers, unsent: sr.unsent}
	lat := sortedLatencies(sr.latencies)
	r.p50, r.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	for _, in := range instances {
		reg := in.svc.Registry()
		r.refusedLockLost += counterValue(reg, "seckill_stale_writes_refused_total", "by", refusedLockLost)
		r.refusedFence += counterValue(reg, "seckill_stale_writes_refused_total", "by", refusedFence)
		r.locksLost += counterValue(reg, "seckillguard_lock_lost_total", "", "")
	}
	if err := readBack(ctx, admin, sku, &r); err != nil {
		return r, err
	}
	return r, nil
}

// resetProduct puts the SKU on sale with stock units, deleting its orders,
// through the admin endpoint. Under a short fixed lease (guard-lease) a slow
// reset may lose its lock and be refused (409); it is sent again then.
func resetProduct(ctx context.Context, client *http.Client, url, sku string, stock int) error {
	body := fmt.Sprintf(`{"sku":%q,"name":"Demo item","stock":%d,"price":9900}`, sku, stock)
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/admin/products", strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("reset %s: %w", sku, err)
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		switch answer := answerOf(resp.StatusCode, data); {
		case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusCreated:
			return nil
		case attempt < 10 && (answer == "409 stale_write" || answer == "409 lock_lost"):
			continue
		}
		return fmt.Errorf("reset %s: %s %s", sku, resp.Status, data)
	}
}

// readBack fills in what the database holds for the SKU.
func readBack(ctx context.Context, db *gorm.DB, sku string, r *modeResult) error {
	db = db.WithContext(ctx)
	var p Product
	if err := db.Where("sku = ?", sku).Take(&p).Error; err != nil {
		return fmt.Errorf("read back %s: %w", sku, err)
	}
	var users int64
	if err := db.Model(&Order{}).Where("sku = ?", sku).Count(&r.orders).Error; err != nil {
		return fmt.Errorf("count the orders of %s: %w", sku, err)
	}
	if err := db.Model(&Order{}).Where("sku = ?", sku).Distinct("user_id").Count(&users).Error; err != nil {
		return fmt.Errorf("count the buyers of %s: %w", sku, err)
	}
	r.stockLeft = p.Stock
	r.duplicates = r.orders - users
	return nil
}

// counterValue sums the counter name over the series whose label has value
// (all series when label is "").
func counterValue(reg *prometheus.Registry, name, label, value string) float64 {
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// busy429 returns how many requests of the mode were answered 429.
func (r modeResult) busy429() int {
	n := 0
	for answer, count := range r.answers {
		if strings.HasPrefix(answer, "429") {
			n += count
		}
	}
	return n
}

// modeWidth is the widest mode name, the width of the demo's mode columns.
var modeWidth = func() int {
	n := 0
	for _, m := range allModes {
		n = max(n, len(m))
	}
	return n
}()

// legend is one line that says what mode m does, its name first, in 78
// columns.
func (m Mode) legend() string {
	what := map[Mode]string{
		ModeNone:         "no lock: read the stock, write it back, create the order",
		ModeLocal:        "a sync.Mutex per instance, each right on its own: the incident",
		ModeGuard:        "the distributed lock of guard.yaml, renewed; writes fenced",
		ModeGuardLease:   "guard with a fixed lease shorter than the pause: locks lost",
		ModeGuardCombine: "guard; the purchases queued behind the holder join its batch",
	}[m]
	return fmt.Sprintf("%-*s  %s", modeWidth, m, what)
}

// printTable prints the demo's two tables, what the database holds and
// what the requests met, and what their columns mean, in 80 columns.
func printTable(w io.Writer, results []modeResult) {
	db := [][]string{{"mode", "orders", "stock left", "oversold", "drift", "dup orders"}}
	reqs := [][]string{{"mode", "requests", "busy 429", "lock lost", "fence", "req/s", "p50", "p99"}}
	busy := 0
	for _, r := range results {
		lost, fence := "-", "-"
		if r.mode.guarded() {
			lost, fence = fmt.Sprint(int64(r.refusedLockLost)), fmt.Sprint(int64(r.refusedFence))
		}
		db = append(db, []string{
			string(r.mode), fmt.Sprint(r.orders), fmt.Sprint(r.stockLeft),
			fmt.Sprint(r.oversold()), fmt.Sprint(r.drift()), fmt.Sprint(r.duplicates),
		})
		reqs = append(reqs, []string{
			string(r.mode), fmt.Sprint(r.requests), fmt.Sprint(r.busy429()), lost, fence,
			fmt.Sprintf("%.0f", r.rps()), formatLatency(r.p50), formatLatency(r.p99),
		})
		busy += r.busy429()
	}
	fmt.Fprintln(w, "The sales, one per mode:")
	for _, r := range results {
		fmt.Fprintln(w, "  "+r.mode.legend())
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "In the database after each sale:")
	printRows(w, db)
	fmt.Fprintln(w, "oversold = orders beyond the stock; drift = stock - left - orders (negative:")
	fmt.Fprintln(w, "units sold whose deduction was lost); dup orders = orders beyond one per buyer")
	fmt.Fprintln(w, "(the unique index allows none).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The requests, and the stale writes the backstop refused:")
	printRows(w, reqs)
	fmt.Fprintln(w, "busy 429 = answered 429, the lock not acquired within the wait (the buyer asks")
	fmt.Fprintln(w, "again). lock lost = writes refused before they were sent, the lock's context")
	fmt.Fprintln(w, "cancelled when its lease ran out; fence = refused by the database, the row")
	fmt.Fprintln(w, "carrying a newer token. req/s, p50, p99: measured by the buyers, retries")
	fmt.Fprintln(w, "included.")
	fmt.Fprintln(w)
	if busy == 0 {
		fmt.Fprintln(w, "No request was answered 429.")
	} else {
		fmt.Fprintf(w, "%d requests were answered 429 (busy) and asked again.\n", busy)
	}
	for _, r := range results {
		if r.unsent > 0 {
			fmt.Fprintf(w, "%s: %d clicks were not sent before -duration ran out.\n", r.mode, r.unsent)
		}
	}
}

// printRows prints rows as a table: the first column left-aligned, the
// others right-aligned, two spaces apart.
func printRows(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, cell := range row {
			if i == 0 {
				fmt.Fprintf(&b, "%-*s", widths[i], cell)
				continue
			}
			fmt.Fprintf(&b, "  %*s", widths[i], cell)
		}
		fmt.Fprintln(w, b.String())
	}
}

func (r modeResult) rps() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.requests) / r.elapsed.Seconds()
}

// demoReport is the demo's -json document.
type demoReport struct {
	Instances   int          `json:"instances"`
	Redis       string       `json:"redis"`
	Database    string       `json:"database"`
	Stock       int          `json:"stock"`
	Buyers      int          `json:"buyers"`
	Repeat      float64      `json:"repeat"`
	Concurrency int          `json:"concurrency"`
	HoldDelayMs float64      `json:"hold_delay_ms"`
	HoldRate    float64      `json:"hold_rate"`
	LeaseMs     float64      `json:"lease_ms"`
	Answered429 int          `json:"answered_429"` // over every mode
	Modes       []modeReport `json:"modes"`
}

// modeReport is one mode's results in the -json document. The stale
// counts are null in the modes that take no lock.
type modeReport struct {
	Mode              string         `json:"mode"`
	Requests          int            `json:"requests"`
	Orders            int64          `json:"orders"`
	StockLeft         int            `json:"stock_left"`
	Oversold          int64          `json:"oversold"`
	Drift             int64          `json:"drift"`
	DuplicateOrders   int64          `json:"duplicate_orders"`
	Answered429       int            `json:"answered_429"`
	StaleLockLost     *int64         `json:"stale_refused_lock_lost"`
	StaleFence        *int64         `json:"stale_refused_fence"`
	LocksLost         int64          `json:"locks_lost"`
	RequestsPerSecond float64        `json:"requests_per_second"`
	P50Ms             float64        `json:"p50_ms"`
	P99Ms             float64        `json:"p99_ms"`
	Answers           map[string]int `json:"answers"`
	Unsent            int            `json:"unsent"`
}

// printJSON writes the results as one JSON document.
func printJSON(w io.Writer, dc *demoConfig, b *Backends, results []modeResult) error {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rep := demoReport{
		Instances: dc.instances, Redis: b.Redis, Database: b.Database, Stock: dc.stock, Buyers: dc.buyers,
		Repeat: dc.repeat, Concurrency: dc.concurrency, HoldDelayMs: ms(dc.holdDelay), HoldRate: dc.holdRate,
		LeaseMs: ms(dc.lease), Modes: []modeReport{},
	}
	for _, r := range results {
		m := modeReport{
			Mode: string(r.mode), Requests: r.requests, Orders: r.orders, StockLeft: r.stockLeft,
			Oversold: r.oversold(), Drift: r.drift(), DuplicateOrders: r.duplicates, Answered429: r.busy429(),
			LocksLost: int64(r.locksLost), RequestsPerSecond: r.rps(), P50Ms: ms(r.p50), P99Ms: ms(r.p99),
			Answers: r.answers, Unsent: r.unsent,
		}
		if r.mode.guarded() {
			lost, fence := int64(r.refusedLockLost), int64(r.refusedFence)
			m.StaleLockLost, m.StaleFence = &lost, &fence
		}
		rep.Answered429 += m.Answered429
		rep.Modes = append(rep.Modes, m)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func formatLatency(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
}

func formatAnswers(answers map[string]int) string {
	keys := make([]string, 0, len(answers))
	for k := range answers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s x%d", k, answers[k])
	}
	return strings.Join(parts, ", ")
}

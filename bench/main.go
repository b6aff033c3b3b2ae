// Command bench measures this framework's lock.Mutex beside
// github.com/go-redsync/redsync/v4, github.com/bsm/redislock and a
// round-trip "floor", against one redis-server it starts for itself, in one
// process, interleaved, over several rounds, and prints a markdown report:
// medians with the min–max over rounds.
//
// From the repository root:
//
//	go -C bench run .            # the full run (8–10 minutes on 2 cores)
//	go -C bench run . -quick     # one short round (under a minute)
//
// It never touches a Redis it did not start (it needs redis-server in PATH).
// docs/BENCHMARKS.md holds the latest report and how to read it.
//
// The same run draws two figures from its own results and writes them into
// the directory of -figures, by default ../docs (the run's working
// directory is bench/), where docs/BENCHMARKS.md shows them beside the
// report: bench-hotkey.svg, the waits on the hot key per library, and
// bench-http.svg, requests per second per mode of the reference service. A
// figure is written only when its scenarios ran (hot, http), replacing the
// file, and its caption names the command, commit and date of the run; the
// run prints the paths it wrote on stderr. -figures "" writes none.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// config is what the flags choose.
type config struct {
	rounds      int
	warmup      time.Duration // each contended run: unmeasured start
	duration    time.Duration // each contended run: the measured window
	drain       time.Duration // each contended run: longest wait for the window's waits to end
	uncontended int           // Lock+Unlock cycles per library and round, uncontended
	blocks      int           // ...run in this many blocks, the libraries taking turns
	handoffs    int           // handoffs per handoff run
	held        []int         // lock counts for the held-locks scaling
	heldRounds  int           // rounds that run the held-locks scaling
	watchdog    time.Duration // watchdog timeout of the held-locks scaling
	scenarios   map[string]bool
	cpuprofile  string // write a CPU profile of the whole run here
	figures     string // write the figures into this directory ("": none)
	busy        bool   // uncontended runs: keep every CPU busy with a nice-19 loop

	httpClients  int           // HTTP runs: requests in flight at once
	httpWarmup   time.Duration // HTTP runs: unmeasured start
	httpDuration time.Duration // HTTP runs: the measured window
	httpDB       string        // HTTP runs: "mysql" or "sqlite"
}

// allScenarios are the groups -scenarios can pick from.
var allScenarios = []string{"uncontended", "hot", "keys", "handoff", "waiters", "held", "http"}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c config
	quick := fs.Bool("quick", false, "one short round: -rounds 1 -duration 500ms -drain 500ms -uncontended 400 -handoffs 8 -held 100,10000 -http-duration 1s")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds; every round runs every library once per scenario, in a rotated order")
	fs.DurationVar(&c.warmup, "warmup", 200*time.Millisecond, "unmeasured start of each contended run")
	fs.DurationVar(&c.duration, "duration", 800*time.Millisecond, "measured window of each contended run")
	fs.DurationVar(&c.drain, "drain", 800*time.Millisecond, "after the window, how long the load goes on at most for the waits begun in it to end")
	fs.IntVar(&c.uncontended, "uncontended", 2000, "uncontended Lock+Unlock cycles per library and round")
	fs.IntVar(&c.blocks, "blocks", 20, "blocks the uncontended cycles are split into, the libraries taking turns")
	fs.BoolVar(&c.busy, "busy", true, "during the uncontended runs, keep every CPU busy with a loop at nice 19, so that no round trip waits for an idle vCPU to wake (on a VM that can take tens of µs and hide what the locks cost); -busy=false measures with idle CPUs")
	fs.IntVar(&c.handoffs, "handoffs", 20, "handoffs measured per handoff run")
	held := fs.String("held", "100,10000,100000", "numbers of locks one Client holds at once, comma-separated")
	fs.IntVar(&c.heldRounds, "held-rounds", 2, "how many of the rounds also run the held-locks scaling (20–40 s each)")
	fs.DurationVar(&c.watchdog, "watchdog", 3*time.Second, "watchdog timeout for the held-locks scaling (renewal every third of it)")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file")
	fs.StringVar(&c.figures, "figures", filepath.Join("..", "docs"), "write the figures ("+hotKeyFigure+", "+httpFigure+") into this directory, replacing them; relative to the working directory (bench/ for go -C bench run .); empty: write none")
	fs.IntVar(&c.httpClients, "http-clients", 64, "HTTP runs: requests in flight at once (closed loop)")
	fs.DurationVar(&c.httpWarmup, "http-warmup", 500*time.Millisecond, "HTTP runs: unmeasured start")
	fs.DurationVar(&c.httpDuration, "http-duration", 2*time.Second, "HTTP runs: measured window")
	fs.StringVar(&c.httpDB, "http-db", "mysql", "HTTP runs: the service's database, mysql (the server of MYSQL_DSN, default "+testenv.DefaultMySQLDSN+"; a database is created and dropped) or sqlite (embedded in each service, in memory)")
	only := fs.String("scenarios", strings.Join(allScenarios, ","), "scenario groups to run: "+strings.Join(allScenarios, ","))
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			c.rounds = 1
		}
		if !set["duration"] {
			c.duration = 500 * time.Millisecond
		}
		if !set["drain"] {
			c.drain = 500 * time.Millisecond
		}
		if !set["uncontended"] {
			c.uncontended = 400
		}
		if !set["handoffs"] {
			c.handoffs = 8
		}
		if !set["held"] {
			*held = "100,10000"
		}
		if !set["http-duration"] {
			c.httpDuration = time.Second
		}
	}
	for _, f := range strings.Split(*held, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("-held: %q is not a positive number", f)
		}
		c.held = append(c.held, n)
	}
	c.scenarios = map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		known := false
		for _, a := range allScenarios {
			known = known || a == s
		}
		if !known {
			return c, fmt.Errorf("-scenarios: unknown %q (want some of %s)", s, strings.Join(allScenarios, ","))
		}
		c.scenarios[s] = true
	}
	if c.rounds < 1 || c.duration <= 0 || c.uncontended < 1 || c.blocks < 1 || c.handoffs < 1 || c.warmup < 0 || c.drain < 0 {
		return c, fmt.Errorf("-rounds, -duration, -uncontended, -blocks and -handoffs must be positive, -warmup and -drain not negative")
	}
	if c.httpClients < 1 || c.httpDuration <= 0 || c.httpWarmup < 0 {
		return c, fmt.Errorf("-http-clients and -http-duration must be positive, -http-warmup not negative")
	}
	if c.httpDB != "mysql" && c.httpDB != "sqlite" {
		return c, fmt.Errorf("-http-db %q: want mysql or sqlite", c.httpDB)
	}
	if c.watchdog < 30*time.Millisecond {
		return c, fmt.Errorf("-watchdog must be at least 30ms")
	}
	return c, nil
}

func main() {
	if os.Getenv(busyEnv) == "1" {
		busyLoop()
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run starts a redis-server of its own, measures, and writes the report to
// out, the figures into cfg.figures, and progress to log.
func run(ctx context.Context, cfg config, out, log io.Writer) error {
	if cfg.figures != "" {
		if err := checkFigureDir(cfg.figures); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "seckillguard-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := testenv.StartRedis(dir)
	if err != nil {
		return err
	}
	defer srv.Kill()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	e := &env{addr: srv.Addr, admin: admin}
	fmt.Fprintf(log, "bench: redis-server on %s; %d rounds\n", srv.Addr, cfg.rounds)

	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	started, load, rev := time.Now(), loadAverage(), revision()
	samples := sampleLoad(ctx, 5*time.Second)
	r, err := measure(ctx, e, cfg, log)
	loads := samples()
	if err != nil {
		return err
	}
	m, err := describeMachine(ctx, admin)
	if err != nil {
		return err
	}
	m.took = time.Since(started)
	m.loadStart, m.loadEnd, m.revision = load, loadAverage(), rev
	for _, l := range loads {
		m.loadMean += l / float64(len(loads))
		m.loadMax = max(m.loadMax, l)
	}
	m.command = commandLine()
	if err := writeReport(out, cfg, m, r); err != nil {
		return err
	}
	if cfg.figures == "" {
		return nil
	}
	written, err := writeFigures(cfg.figures, cfg, m, r)
	for _, path := range written {
		fmt.Fprintf(log, "bench: wrote %s\n", path)
	}
	return err
}

// commandLine is how this run was started, for the report.
func commandLine() string {
	args := []string{"go -C bench run ."}
	for _, a := range os.Args[1:] {
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// sampleLoad reads the 1-minute load average now and every interval until
// the returned function is called, which returns the samples.
func sampleLoad(ctx context.Context, interval time.Duration) func() []float64 {
	var (
		mu   sync.Mutex
		out  []float64
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	read := func() {
		if v, err := strconv.ParseFloat(loadAverage(), 64); err == nil {
			mu.Lock()
			out = append(out, v)
			mu.Unlock()
		}
	}
	read()
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				read()
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() []float64 {
		close(stop)
		<-done
		read()
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

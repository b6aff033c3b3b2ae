package main

// The whole HTTP path: the reference service example-seckill, built from
// this working tree and run as its own process, once in mode none (no lock)
// and once in mode guard (the policies of its guard.yaml: the distributed
// lock on the SKU, fenced writes), both on one redis-server of their own and
// one database; the same closed-loop HTTP load is sent to each in turn.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// An httpRow is one service configuration under the same load.
type httpRow struct {
	name string // row label
	mode string // the service's -mode
	idem bool   // every request carries an Idempotency-Key
}

// httpRows are the rows, in the order the tables list them. "none" must
// stay first: the costs are differences to it.
var httpRows = []httpRow{
	{name: "none", mode: "none"},
	// local: one sync.Mutex for the process, no Redis; on one SKU the
	// floor of any lock that runs the purchases one at a time.
	{name: "local", mode: "local"},
	{name: "guard", mode: "guard"},
	{name: "guard, with Idempotency-Key", mode: "guard", idem: true},
	{name: "guard-combine", mode: "guard-combine"},
}

// An httpShape is one way of spreading the purchases over SKUs.
type httpShape struct {
	id    string // key in the results
	title string
	skus  int
}

var httpShapes = []httpShape{
	{id: "http1", title: "one SKU", skus: 1},
	{id: "http1024", title: "1,024 SKUs", skus: 1024},
}

// httpStock is every SKU's stock: no run sells out, so every request goes
// through the lock and the purchase.
const httpStock = 1_000_000_000

func shapeSKUs(s httpShape) []string {
	if s.skus == 1 {
		return []string{"bench-hot"}
	}
	out := make([]string, s.skus)
	for i := range out {
		out[i] = "bench-" + strconv.Itoa(i)
	}
	return out
}

// httpEnv is what the HTTP runs share: the service binary, a redis-server
// of their own (the lock runs' FLUSHALL would reset the fencing counters
// under rows that carry their tokens, and their traffic would mix with the
// lock runs' counts), the database, and one service process per mode.
type httpEnv struct {
	dir      string
	bin      string
	redis    *testenv.RedisServer
	admin    *redis.Client
	db       string // "mysql" or "sqlite"
	dsn      string // MYSQL_DSN of the services (mysql)
	dbAdmin  *sql.DB
	dbName   string
	dbServer string // "MariaDB 10.11.x on 127.0.0.1:3306", ...
	dbPID    int    // the database server's process on this machine, 0 when unknown
	services map[string]*service
	users    atomic.Int64 // buyers so far: every request is a new buyer
}

// httpDBPrefix names the database the run creates. It shares the prefix and
// the "<prefix><pid>_" form of internal/testkit/testenv's test databases, so that a
// test run drops it if this process was killed before it could.
const httpDBPrefix = "sgtest_"

// startHTTP builds example-seckill, starts its redis-server, creates the
// database (db "mysql": on the server of MYSQL_DSN, default
// testenv.DefaultMySQLDSN; "sqlite": every service embeds its own in
// memory), and starts one service per mode with the products created.
func startHTTP(ctx context.Context, db string, log io.Writer) (_ *httpEnv, err error) {
	dir, err := os.MkdirTemp("", "seckillguard-bench-http-")
	if err != nil {
		return nil, err
	}
	e := &httpEnv{dir: dir, db: db, services: map[string]*service{}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	t0 := time.Now()
	if e.bin, err = buildService(ctx, dir); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "bench: built example-seckill in %v\n", time.Since(t0).Round(time.Millisecond))
	if e.redis, err = testenv.StartRedis(dir); err != nil {
		return nil, err
	}
	e.admin = redis.NewClient(&redis.Options{Addr: e.redis.Addr})
	switch db {
	case "mysql":
		if err := e.createDatabase(ctx); err != nil {
			return nil, err
		}
	case "sqlite":
		e.dbServer = "embedded SQLite in memory (pure Go), one database per service process"
	default:
		return nil, fmt.Errorf("-http-db %q: want mysql or sqlite", db)
	}
	for _, r := range httpRows {
		if e.services[r.mode] != nil {
			continue
		}
		s, err := e.startService(ctx, r.mode)
		if err != nil {
			return nil, err
		}
		e.services[r.mode] = s
	}
	// The products: with SQLite every service has its own database; with
	// MySQL one creation serves both.
	for _, r := range httpRows {
		if err := e.services[r.mode].putProducts(ctx); err != nil {
			return nil, err
		}
		if db == "mysql" {
			break
		}
	}
	return e, nil
}

// buildService builds ../example-seckill (the working tree this module
// replaces the framework with) into dir.
func buildService(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "example-seckill")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./example-seckill")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./example-seckill (in ..): %v: %s", err, bytes.TrimSpace(out))
	}
	return bin, nil
}

// createDatabase creates an empty database for the services.
func (e *httpEnv) createDatabase(ctx context.Context) error {
	raw := os.Getenv("MYSQL_DSN")
	if raw == "" {
		raw = testenv.DefaultMySQLDSN
	}
	cfg, err := mysql.ParseDSN(raw)
	if err != nil {
		return fmt.Errorf("MYSQL_DSN %q: %w", raw, err)
	}
	adminCfg := cfg.Clone()
	adminCfg.DBName = ""
	adminCfg.Timeout = 3 * time.Second
	db, err := sql.Open("mysql", adminCfg.FormatDSN())
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		return fmt.Errorf("MariaDB/MySQL not reachable at %s (%v): start it, set MYSQL_DSN, or run with -http-db sqlite", raw, err)
	}
	e.dbAdmin = db
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return err
	}
	name := fmt.Sprintf("%s%d_bench_http", httpDBPrefix, os.Getpid())
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	e.dbName = name
	// The server's process, when it runs here: its CPU time is measured
	// too (it is shared: other clients' work counts as well).
	var pidFile string
	if db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile) == nil && (strings.HasPrefix(cfg.Addr, "127.") || strings.HasPrefix(cfg.Addr, "localhost")) {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if _, err := processCPUOf(pid); err == nil {
					e.dbPID = pid
				}
			}
		}
	}
	svcCfg := cfg.Clone()
	svcCfg.DBName = name
	e.dsn = svcCfg.FormatDSN()
	e.dbServer = fmt.Sprintf("MySQL-protocol server %s on %s (database %s, created and dropped by the run)", version, cfg.Addr, name)
	if strings.Contains(strings.ToLower(version), "mariadb") {
		e.dbServer = fmt.Sprintf("MariaDB %s on %s (database %s, created and dropped by the run)", strings.SplitN(version, "-", 2)[0], cfg.Addr, name)
	}
	return nil
}

// close stops the services and the redis-server and drops the database.
func (e *httpEnv) close() {
	var wg sync.WaitGroup
	for _, s := range e.services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stop()
		}()
	}
	wg.Wait()
	if e.admin != nil {
		_ = e.admin.Close()
	}
	if e.redis != nil {
		e.redis.Kill()
	}
	if e.dbAdmin != nil {
		if e.dbName != "" {
			_, _ = e.dbAdmin.Exec("DROP DATABASE IF EXISTS `" + e.dbName + "`")
		}
		_ = e.dbAdmin.Close()
	}
	_ = os.RemoveAll(e.dir)
}

// service is one example-seckill process.
type service struct {
	mode   string
	cmd    *exec.Cmd
	url    string // http://127.0.0.1:port
	stderr string // its log file
	exited chan struct{}
	client *http.Client // for setting up, not for the load
}

// startService starts example-seckill serve in mode on a free loopback port
// and waits for the line that says it listens.
func (e *httpEnv) startService(ctx context.Context, mode string) (*service, error) {
	s := &service{mode: mode, stderr: filepath.Join(e.dir, "service-"+mode+".log"), exited: make(chan struct{}),
		client: &http.Client{Timeout: 10 * time.Second}}
	logf, err := os.Create(s.stderr)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(e.bin, "serve", "-addr", "127.0.0.1:0", "-mode", mode)
	s.cmd.Dir = e.dir
	s.cmd.Env = append(os.Environ(), "REDIS_URL=redis://"+e.redis.Addr+"/0", "MYSQL_DSN="+e.dsn)
	s.cmd.Stderr = logf
	// The service dies with the benchmark even when the benchmark is killed.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			if first {
				lines <- sc.Text()
				first = false
			}
		}
		close(lines)
	}()
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	fail := func(err error) (*service, error) {
		s.stop()
		log, _ := os.ReadFile(s.stderr)
		return nil, fmt.Errorf("example-seckill -mode %s: %v; its log: %s", mode, err, tail(string(log), 5))
	}
	select {
	case line, ok := <-lines:
		// "example-seckill: listening on 127.0.0.1:PORT, mode ..."
		_, rest, found := strings.Cut(line, "listening on ")
		addr, _, _ := strings.Cut(rest, ",")
		if !ok || !found || addr == "" {
			return fail(fmt.Errorf("no address in its first line %q", line))
		}
		s.url = "http://" + addr
	case <-time.After(30 * time.Second):
		return fail(errors.New("not listening after 30s"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	return s, nil
}

// stop ends the service: SIGTERM (it drains and closes), SIGKILL after 10s.
func (s *service) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// putProducts creates the products of every shape, 16 at a time.
func (s *service) putProducts(ctx context.Context) error {
	skus := make(chan string)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sku := range skus {
				if err := s.putProduct(ctx, sku, httpStock); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
send:
	for _, sh := range httpShapes {
		for _, sku := range shapeSKUs(sh) {
			select {
			case skus <- sku:
			case err = <-errs:
				break send
			}
		}
	}
	close(skus)
	wg.Wait()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	return err
}

// putProduct creates or resets a product through the admin endpoint.
func (s *service) putProduct(ctx context.Context, sku string, stock int) error {
	body := fmt.Sprintf(`{"sku":%q,"name":"bench","stock":%d,"price":1}`, sku, stock)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/api/admin/products", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("create product %s on the %s service: %w", sku, s.mode, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		log, _ := os.ReadFile(s.stderr)
		return fmt.Errorf("create product %s on the %s service: %d %s; its log: %s",
			sku, s.mode, resp.StatusCode, bytes.TrimSpace(b), tail(string(log), 3))
	}
	return nil
}

// cpu returns the CPU time the service process used so far.
func (s *service) cpu() (time.Duration, error) { return processCPUOf(s.cmd.Process.Pid) }

// processCPUOf returns the CPU time (user + system) process pid used so far,
// from /proc/<pid>/stat (clock ticks of 10 ms).
func processCPUOf(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; the fields after its
	// closing parenthesis start with field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unreadable /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable /proc stat times")
	}
	const tick = 10 * time.Millisecond // USER_HZ = 100 on Linux
	return time.Duration(ut+st) * tick, nil
}

// httpLoad is one HTTP run: clients goroutines, each sending one purchase
// after another on a keep-alive connection, every purchase by a new buyer.
type httpLoad struct {
	clients  int
	skus     []string
	idem     bool
	warmup   time.Duration
	duration time.Duration // the measured window, when count is 0
	count    int64         // otherwise: measure exactly this many requests (go test -bench)
}

// httpResult is what one HTTP run measured in its window.
type httpResult struct {
	requests   int64
	window     time.Duration
	latencies  []time.Duration // sorted, of the requests answered in the window
	answers    map[string]int  // by "<status> <error code>", requests answered in the window
	serviceCPU time.Duration
	dbCPU      time.Duration // the database server's, when known (else -1)
	cost       cost          // Redis commands and CPU (sent: 0, the service's client is not hooked)
	// What the database holds after the run, over every request of it
	// (warm-up and drain included), with MySQL; -1 with SQLite: drift =
	// units deducted - orders created (negative: deductions lost, units
	// sold twice), dups = orders beyond one per buyer and SKU.
	drift, dups int64
}

// ledger is the stock left and the orders in the run's database.
type ledger struct{ stock, orders, pairs int64 }

// readLedger reads the ledger; ok is false with SQLite.
func (e *httpEnv) readLedger(ctx context.Context) (ledger, bool, error) {
	if e.dbAdmin == nil || e.dbName == "" {
		return ledger{}, false, nil
	}
	var l ledger
	db := "`" + e.dbName + "`"
	if err := e.dbAdmin.QueryRowContext(ctx, "SELECT COALESCE(SUM(stock), 0) FROM "+db+".products").Scan(&l.stock); err != nil {
		return l, false, err
	}
	err := e.dbAdmin.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT user_id, sku) FROM "+db+".orders").Scan(&l.orders, &l.pairs)
	return l, err == nil, err
}

// runHTTP sends ld to s and measures the window. Requests answered in the
// window count; after it, the requests in flight are let finish (not
// counted), so that no purchase is cut short on the server.
func runHTTP(ctx context.Context, e *httpEnv, s *service, ld httpLoad) (httpResult, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = ld.clients * 2
	t.MaxIdleConnsPerHost = ld.clients * 2
	t.DisableCompression = true
	client := &http.Client{Transport: t, Timeout: 30 * time.Second}
	defer t.CloseIdleConnections()

	var (
		phase    atomic.Int32
		left     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		lats     []time.Duration
		answers  = map[string]int{}
		firstErr error
		start    = make(chan struct{})
		started  sync.Once
	)
	begin := func() { started.Do(func() { close(start) }) }
	left.Store(ld.count)
	ledger0, exact, err := e.readLedger(ctx)
	if err != nil {
		return httpResult{}, err
	}
	if ld.count > 0 {
		phase.Store(phaseWindow)
	}
	for range ld.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			got := map[string]int{}
			defer func() {
				mu.Lock()
				lats = append(lats, mine...)
				for k, v := range got {
					answers[k] += v
				}
				mu.Unlock()
			}()
			<-start
			for phase.Load() != phaseDrain && ctx.Err() == nil {
				if ld.count > 0 && left.Add(-1) < 0 {
					return
				}
				sku := ld.skus[0]
				if len(ld.skus) > 1 {
					sku = ld.skus[rand.IntN(len(ld.skus))]
				}
				user := "b" + strconv.FormatInt(e.users.Add(1), 10)
				t0 := time.Now()
				answer, err := buy(ctx, client, s.url, sku, user, ld.idem)
				d := time.Since(t0)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					answer = "transport error"
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
				if phase.Load() == phaseWindow {
					mine = append(mine, d)
					got[answer]++
				}
			}
		}()
	}

	var before, after snapshot
	var cpu0, cpu1, db0, db1 time.Duration
	dbCPU := func() time.Duration {
		if e.dbPID == 0 {
			return -1
		}
		d, err := processCPUOf(e.dbPID)
		if err != nil {
			return -1
		}
		return d
	}
	var window time.Duration
	measureStart := func() error {
		if before, err = takeSnapshot(ctx, e.admin, 0); err != nil {
			return err
		}
		db0 = dbCPU()
		cpu0, err = s.cpu()
		return err
	}
	measureEnd := func() error {
		if after, err = takeSnapshot(ctx, e.admin, 0); err != nil {
			return err
		}
		db1 = dbCPU()
		cpu1, err = s.cpu()
		return err
	}
	stopAll := func() {
		phase.Store(phaseDrain)
		begin()
		wg.Wait()
	}
	if ld.count > 0 {
		if err := measureStart(); err != nil {
			stopAll()
			return httpResult{}, err
		}
		t0 := time.Now()
		begin()
		wg.Wait()
		window = time.Since(t0)
		if err := measureEnd(); err != nil {
			return httpResult{}, err
		}
	} else {
		begin()
		if err := sleepCtx(ctx, ld.warmup); err != nil {
			stopAll()
			return httpResult{}, err
		}
		if err := measureStart(); err != nil {
			stopAll()
			return httpResult{}, err
		}
		phase.Store(phaseWindow)
		t0 := time.Now()
		if err := sleepCtx(ctx, ld.duration); err != nil {
			stopAll()
			return httpResult{}, err
		}
		phase.Store(phaseDrain)
		window = time.Since(t0)
		if err := measureEnd(); err != nil {
			stopAll()
			return httpResult{}, err
		}
		wg.Wait()
	}
	select {
	case <-s.exited:
		log, _ := os.ReadFile(s.stderr)
		return httpResult{}, fmt.Errorf("the %s service exited during the run; its log: %s", s.mode, tail(string(log), 5))
	default:
	}
	res := httpResult{window: window, latencies: sortDurations(lats), answers: answers,
		serviceCPU: cpu1 - cpu0, dbCPU: -1, cost: costBetween(before, after), drift: -1, dups: -1}
	if exact {
		// Every request of the run has had its answer (wg.Wait).
		ledger1, _, err := e.readLedger(ctx)
		if err != nil {
			return res, err
		}
		orders := ledger1.orders - ledger0.orders
		res.drift = (ledger0.stock - ledger1.stock) - orders
		res.dups = (ledger1.orders - ledger1.pairs) - (ledger0.orders - ledger0.pairs)
	}
	if db0 >= 0 && db1 >= 0 {
		res.dbCPU = db1 - db0
	}
	res.requests = int64(len(lats))
	if n := answers["transport error"]; n > 0 && firstErr != nil {
		return res, fmt.Errorf("%d requests failed, the first: %v", n, firstErr)
	}
	return res, nil
}

// buy sends one purchase and names its answer "<status>" or "<status>
// <error code>".
func buy(ctx context.Context, client *http.Client, base, sku, user string, idem bool) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/seckill/"+sku, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("X-User-ID", user)
	if idem {
		req.Header.Set("Idempotency-Key", "k-"+user)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.StatusCode == http.StatusCreated {
		return "201", nil
	}
	code := ""
	if _, rest, ok := bytes.Cut(body, []byte(`"error":"`)); ok {
		if c, _, ok := bytes.Cut(rest, []byte(`"`)); ok {
			code = " " + string(c)
		}
	}
	return strconv.Itoa(resp.StatusCode) + code, nil
}

// measureHTTP runs every HTTP shape and row once (one round), the rows in an
// order rotated by round, and records each row's values and its cost: the
// difference to the none row of the same shape and round.
func measureHTTP(ctx context.Context, h *httpEnv, cfg config, r *results, round int, log io.Writer, tag string) error {
	order := append(append([]httpRow(nil), httpRows[round%len(httpRows):]...), httpRows[:round%len(httpRows)]...)
	for _, sh := range httpShapes {
		got := map[string]httpResult{}
		for _, row := range order {
			ld := httpLoad{clients: cfg.httpClients, skus: shapeSKUs(sh), idem: row.idem, warmup: cfg.httpWarmup, duration: cfg.httpDuration}
			x, err := runHTTP(ctx, h, h.services[row.mode], ld)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				r.note("round %d, %s, %s: %v", round+1, sh.id, row.name, err)
				fmt.Fprintf(log, "%s %-7s %-28s error: %v\n", tag, sh.id, row.name, err)
				continue
			}
			got[row.name] = x
			r.addHTTP(sh, row, x)
			fmt.Fprintf(log, "%s %-7s %-28s %7.0f req/s  p50 %7.2f ms  p99 %7.2f ms  service CPU %5.0f µs/req  drift %d  dups %d\n",
				tag, sh.id, row.name, float64(x.requests)/x.window.Seconds(), percentile(x.latencies, 50)/1e6,
				percentile(x.latencies, 99)/1e6, float64(x.serviceCPU.Microseconds())/float64(max(x.requests, 1)), x.drift, x.dups)
		}
		base, ok := got[httpRows[0].name]
		if !ok {
			continue
		}
		for _, row := range httpRows[1:] {
			if x, ok := got[row.name]; ok {
				r.addHTTPCost(sh, row, base, x)
			}
		}
	}
	return nil
}

// httpValues are a run's values, by metric.
func httpValues(x httpResult) map[string]float64 {
	n := float64(max(x.requests, 1))
	ok := float64(x.answers["201"])
	db := math.NaN()
	if x.dbCPU >= 0 {
		db = float64(x.dbCPU.Nanoseconds()) / 1e3 / n
	}
	return map[string]float64{
		"dbcpu": db,
		"rps":   float64(x.requests) / x.window.Seconds(),
		"p50":   percentile(x.latencies, 50) / 1e6,
		"p99":   percentile(x.latencies, 99) / 1e6,
		"max":   percentile(x.latencies, 100) / 1e6,
		"ok":    ok / n * 100,
		"cpu":   float64(x.serviceCPU.Nanoseconds()) / 1e3 / n,
		"exec":  float64(x.cost.executed) / n,
		"rcpu":  float64(x.cost.redisCPU.Nanoseconds()) / 1e3 / n,
		"drift": nanIfNegative(x.drift, x.dups),
		"dups":  nanIfNegative(x.dups, x.dups),
	}
}

// nanIfNegative is v, or NaN when unknown is -1 (no ledger with SQLite).
func nanIfNegative(v, unknown int64) float64 {
	if unknown < 0 {
		return math.NaN()
	}
	return float64(v)
}

func (r *results) addHTTP(sh httpShape, row httpRow, x httpResult) {
	for m, v := range httpValues(x) {
		r.add(sh.id, row.name, m, v)
	}
	k := key(sh.id, row.name, "")
	if r.answers[k] == nil {
		r.answers[k] = map[string]int{}
	}
	for a, n := range x.answers {
		r.answers[k][a] += n
	}
	r.keepBreakdown(sh.id, row.name, x.cost.byCommand, float64(max(x.requests, 1)))
}

// addHTTPCost records what row costs a request more than base (the none
// row) in the same round: the differences of the latencies and of the CPU
// and Redis work per request, and the change of throughput.
func (r *results) addHTTPCost(sh httpShape, row httpRow, base, x httpResult) {
	b, v := httpValues(base), httpValues(x)
	r.add(sh.id, row.name, "dp50", v["p50"]-b["p50"])
	r.add(sh.id, row.name, "dp99", v["p99"]-b["p99"])
	r.add(sh.id, row.name, "drps", (v["rps"]/b["rps"]-1)*100)
	r.add(sh.id, row.name, "dtime", (1/v["rps"]-1/b["rps"])*1e6) // µs of the run's wall time per request
	r.add(sh.id, row.name, "dcpu", v["cpu"]-b["cpu"])
	r.add(sh.id, row.name, "ddbcpu", v["dbcpu"]-b["dbcpu"])
	r.add(sh.id, row.name, "dexec", v["exec"]-b["exec"])
	r.add(sh.id, row.name, "drcpu", v["rcpu"]-b["rcpu"])
}

// tail returns the last n lines of s, joined with " | ".
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// writeHTTP writes the HTTP tables.
func writeHTTP(w io.Writer, cfg config, r *results) {
	fmt.Fprintf(w, "### The whole HTTP path\n\n")
	fmt.Fprintf(w, "The reference service `example-seckill`, built from this working tree, one process per mode: `serve -mode none` (no lock), `serve -mode local` (one `sync.Mutex` for the whole process: the purchases one at a time, the stock read before the transaction, no Redis; on one SKU this is a lock that costs nothing, the floor of any lock that serialises the purchases; over 1,024 SKUs it serialises them all, which no per-SKU lock does) and `serve -mode guard` (the policies of its built-in guard.yaml: the distributed lock `sku:<sku>`, wait 2 s, watchdog; the product row read with `SELECT … FOR UPDATE` in the transaction that writes it, the writes fenced with the lock's token) and `serve -mode guard-combine` (the same lock and purchase, the purchases of the process that queue behind the holder of a SKU's lock run in its batch: one transaction, a savepoint per purchase, one commit per hold). All on a redis-server of their own (not the lock runs') and %s. %d clients in the benchmark process (Go net/http, keep-alive) send purchases (`POST /api/seckill/:sku`) in a closed loop, each by a new buyer (`X-User-ID`), with no `Idempotency-Key` except in the rows that say so, either all on one SKU or each on one of %s SKUs picked at random (then a request finds its SKU taken by another in flight about %.0f%% of the time); every SKU has a stock of 10⁹, so nothing sells out and every request buys; drift (units deducted − orders created) and dup orders (beyond one per buyer) are read from the database over every request of a run, warm-up and drain included. Measured: a window of %v after %v of warm-up, the requests answered in it (those in flight at its end finish uncounted); the modes take turns in every round, in an order rotated each round. CPU times per request are the service process's and the database server's (from /proc, 10 ms ticks; the database server is shared with whatever else uses it, so its column is the noisiest); Redis: commands run (INFO commandstats, script-internal ones included) and CPU of the services' redis-server.\n\n",
		r.httpSetup, cfg.httpClients, strings.TrimSuffix(httpShapes[1].title, " SKUs"), 100*float64(cfg.httpClients-1)/float64(httpShapes[1].skus), cfg.httpDuration, cfg.httpWarmup)
	t := newTable(w, "SKUs", "mode", "requests/s", "p50 ms", "p99 ms", "max ms", "answered 201, %", "drift", "dup orders", "service CPU µs / req", "database CPU µs / req", "commands Redis ran / req", "Redis CPU µs / req")
	for _, sh := range httpShapes {
		for _, row := range httpRows {
			g := func(m string) []float64 { return r.get(sh.id, row.name, m) }
			t.row(sh.title, row.name, cell(g("rps"), ""), cell(g("p50"), ""), cell(g("p99"), ""), cell(g("max"), ""), cell(g("ok"), ""), cell(g("drift"), ""), cell(g("dups"), ""), cell(g("cpu"), ""), cell(g("dbcpu"), ""), cell(g("exec"), ""), cell(g("rcpu"), ""))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "What the guard costs a request: the difference to `none` in the same round (median over rounds, min–max). \"Time per request\" is 1/throughput − 1/throughput of `none`: the extra wall time the service needs per request at this load.\n\n")
	t = newTable(w, "SKUs", "mode", "requests/s", "time per request µs", "p50 ms", "p99 ms", "service CPU µs / req", "database CPU µs / req", "commands Redis ran / req", "Redis CPU µs / req")
	for _, sh := range httpShapes {
		for _, row := range httpRows[1:] {
			g := func(m string) []float64 { return r.get(sh.id, row.name, m) }
			t.row(sh.title, row.name, signed(g("drps"), "%"), signed(g("dtime"), ""), signed(g("dp50"), ""), signed(g("dp99"), ""), signed(g("dcpu"), ""), signed(g("ddbcpu"), ""), signed(g("dexec"), ""), signed(g("drcpu"), ""))
		}
	}
	fmt.Fprintln(w)
	var other []string
	for _, sh := range httpShapes {
		for _, row := range httpRows {
			m := r.answers[key(sh.id, row.name, "")]
			var parts []string
			for a, n := range m {
				if a != "201" {
					parts = append(parts, fmt.Sprintf("%d × %s", n, a))
				}
			}
			if len(parts) > 0 {
				sort.Strings(parts)
				other = append(other, fmt.Sprintf("%s, %s: %s", sh.title, row.name, strings.Join(parts, ", ")))
			}
		}
	}
	if len(other) > 0 {
		fmt.Fprintf(w, "Answers other than 201, all rounds: %s.\n\n", strings.Join(other, "; "))
	} else {
		fmt.Fprintf(w, "Every request counted was answered 201 (an order).\n\n")
	}
	if cfg.figures != "" {
		fmt.Fprintf(w, "![Requests per second per mode, one SKU and 1,024 SKUs: the median over rounds, the min–max, and the ratio to none](%s)\n\n", httpFigure)
	}
	var rows []contender
	for _, row := range httpRows {
		rows = append(rows, contender{name: row.name})
	}
	for _, sh := range httpShapes {
		writeBreakdown(w, "mode", rows, r, sh.id, "What Redis ran per request, "+sh.title+" (last round)")
	}
}

// signed is cell with a sign on the median.
func signed(vs []float64, unit string) string {
	s := cell(vs, unit)
	if s != "—" && !strings.HasPrefix(s, "-") {
		s = "+" + s
	}
	return s
}

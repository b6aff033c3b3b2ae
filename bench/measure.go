package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// setupCommands are the commands Redis runs that belong to the harness or to
// opening a connection, not to locking: they are left out of the executed
// count. (A new go-redis connection sends HELLO and CLIENT SETINFO; the
// harness sends INFO, PING and FLUSHALL.)
var setupCommands = map[string]bool{
	"info": true, "hello": true, "ping": true, "flushall": true, "select": true, "auth": true,
}

// isSetup reports whether the commandstats name belongs to setupCommands or
// to a CLIENT/CONFIG/COMMAND subcommand.
func isSetup(name string) bool {
	if setupCommands[name] {
		return true
	}
	for _, p := range []string{"client|", "config|", "command|"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// serverStats is what INFO reports about the work Redis did so far.
type serverStats struct {
	calls  map[string]int64 // INFO commandstats calls by command name (script-internal calls included)
	cpu    time.Duration    // used_cpu_user + used_cpu_sys
	script time.Duration    // INFO commandstats usec of EVALSHA and EVAL: the time Redis spent running scripts
}

// readServerStats reads INFO commandstats and cpu in one call.
func readServerStats(ctx context.Context, admin *redis.Client) (serverStats, error) {
	txt, err := admin.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return serverStats{}, fmt.Errorf("INFO: %w", err)
	}
	st := serverStats{calls: make(map[string]int64)}
	var cpuSec float64
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(k, "cmdstat_"):
			name := strings.TrimPrefix(k, "cmdstat_")
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					st.calls[name] = c
				}
				if n, ok := strings.CutPrefix(f, "usec="); ok && (name == "evalsha" || name == "eval") {
					us, _ := strconv.ParseInt(n, 10, 64)
					st.script += time.Duration(us) * time.Microsecond
				}
			}
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			cpuSec += f
		}
	}
	st.cpu = time.Duration(cpuSec * float64(time.Second))
	return st, nil
}

// executedSince returns how many lock-related commands Redis ran between
// before and after, and the counts by name.
func executedSince(before, after serverStats) (int64, map[string]int64) {
	by := make(map[string]int64)
	var total int64
	for name, n := range after.calls {
		d := n - before.calls[name]
		if d == 0 || isSetup(name) {
			continue
		}
		by[name] = d
		total += d
	}
	return total, by
}

// processCPU returns the CPU time (user + system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// snapshot is everything measured at the start and the end of a run.
type snapshot struct {
	at      time.Time
	server  serverStats
	cpu     time.Duration
	mallocs uint64
	bytes   uint64
	sent    int64
}

// takeSnapshot reads the counters. sent is the commands the contender's
// clients sent so far (a CommandCounter total).
func takeSnapshot(ctx context.Context, admin *redis.Client, sent int64) (snapshot, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, err := readServerStats(ctx, admin)
	if err != nil {
		return snapshot{}, err
	}
	return snapshot{at: time.Now(), server: st, cpu: processCPU(), mallocs: ms.Mallocs, bytes: ms.TotalAlloc, sent: sent}, nil
}

// cost is the work done between two snapshots.
type cost struct {
	elapsed   time.Duration
	sent      int64            // commands the clients sent
	executed  int64            // commands Redis ran, script-internal ones included
	byCommand map[string]int64 // executed, by name
	cpu       time.Duration    // this process
	redisCPU  time.Duration    // redis-server
	script    time.Duration    // redis-server running script calls (commandstats usec)
	mallocs   uint64
	bytes     uint64
}

// plus returns the sum of c and d.
func (c cost) plus(d cost) cost {
	by := make(map[string]int64, len(c.byCommand)+len(d.byCommand))
	for k, v := range c.byCommand {
		by[k] += v
	}
	for k, v := range d.byCommand {
		by[k] += v
	}
	return cost{
		elapsed:   c.elapsed + d.elapsed,
		sent:      c.sent + d.sent,
		executed:  c.executed + d.executed,
		byCommand: by,
		cpu:       c.cpu + d.cpu,
		redisCPU:  c.redisCPU + d.redisCPU,
		script:    c.script + d.script,
		mallocs:   c.mallocs + d.mallocs,
		bytes:     c.bytes + d.bytes,
	}
}

func costBetween(a, b snapshot) cost {
	ex, by := executedSince(a.server, b.server)
	return cost{
		elapsed:   b.at.Sub(a.at),
		sent:      b.sent - a.sent,
		executed:  ex,
		byCommand: by,
		cpu:       b.cpu - a.cpu,
		redisCPU:  b.server.cpu - a.server.cpu,
		script:    b.server.script - a.server.script,
		mallocs:   b.mallocs - a.mallocs,
		bytes:     b.bytes - a.bytes,
	}
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted, by the
// nearest-rank method; NaN when sorted is empty.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return float64(sorted[rank-1])
}

// sortDurations sorts d in place and returns it.
func sortDurations(d []time.Duration) []time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d
}

// critical stands for a critical section of d. time.Sleep cannot do less than
// about a millisecond here, so short sections spin; sections of 2 ms or more
// sleep for all but the last millisecond and spin the rest, so that a holder
// does not occupy a whole core of a small machine for the length of a run.
func critical(d time.Duration) {
	if d <= 0 {
		return
	}
	start := time.Now()
	if d >= 2*time.Millisecond {
		time.Sleep(d - time.Millisecond)
	}
	for time.Since(start) < d {
	}
}

// machineBusy returns the CPU time all processors spent busy so far (user,
// nice, system, irq, softirq, steal; not idle or I/O wait), from /proc/stat
// in clock ticks of 10 ms, and false when it cannot be read.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		busy += v
	}
	return time.Duration(busy) * 10 * time.Millisecond, true
}

// settle waits until the machine is nearly idle — all processors together
// busy less than a tenth of one for 300 ms — or up to limit, so that a
// measurement does not start while the work of the previous one (a
// database flushing what the HTTP runs wrote, a redis-server freeing a
// flushed keyspace) or anybody else's still runs. It returns how long it
// waited and whether the machine got that quiet.
func settle(ctx context.Context, limit time.Duration) (time.Duration, bool, error) {
	const window = 300 * time.Millisecond
	start := time.Now()
	for time.Since(start) < limit {
		b0, ok := machineBusy()
		if !ok {
			return 0, true, nil
		}
		if err := sleepCtx(ctx, window); err != nil {
			return 0, false, err
		}
		b1, _ := machineBusy()
		if b1-b0 < window/10 {
			return time.Since(start), true, nil
		}
	}
	return time.Since(start), false, nil
}

// inGoRedis is a go-redis hook that adds up the time its client's commands
// spend in go-redis: writing them, the round trip, Redis running them, and
// reading the replies. A cycle's time less this is what the library's own
// code took between and around its round trips. One goroutine at a time.
type inGoRedis struct{ d time.Duration }

func (h *inGoRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *inGoRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t := time.Now()
		err := next(ctx, cmd)
		h.d += time.Since(t)
		return err
	}
}

func (h *inGoRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t := time.Now()
		err := next(ctx, cmds)
		h.d += time.Since(t)
		return err
	}
}

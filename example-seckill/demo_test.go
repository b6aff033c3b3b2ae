package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// row is one mode's results in the demo's -json document.
type row struct {
	mode                                    string
	requests, orders, left, oversold, drift int
	duplicates                              int
	refusedLockLost, refusedFence           string // "-" in the modes without a lock
}

// runDemoCommand runs the demo command with -json as main does and returns
// its modes' results and the document.
func runDemoCommand(t *testing.T, vars map[string]string, args ...string) (map[string]row, string) {
	t.Helper()
	var out, info bytes.Buffer
	if err := run(context.Background(), append([]string{"demo", "-json"}, args...), env(vars), &out, &info); err != nil {
		t.Fatalf("demo: %v\n%s%s", err, info.String(), out.String())
	}
	var rep demoReport
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil || dec.More() {
		t.Fatalf("stdout is not one JSON document (%v):\n%s", err, out.String())
	}
	doc, _ := json.MarshalIndent(rep, "", "  ")
	count := func(n *int64) string {
		if n == nil {
			return "-"
		}
		return strconv.FormatInt(*n, 10)
	}
	rows := make(map[string]row)
	for _, m := range rep.Modes {
		rows[m.Mode] = row{
			mode: m.Mode, requests: m.Requests, orders: int(m.Orders), left: m.StockLeft, oversold: int(m.Oversold),
			drift: int(m.Drift), duplicates: int(m.DuplicateOrders),
			refusedLockLost: count(m.StaleLockLost), refusedFence: count(m.StaleFence),
		}
	}
	return rows, info.String() + string(doc)
}

// wantCured checks the guard modes' invariants in a table row: nothing
// oversold, no stock update lost, no buyer twice, every unit accounted for.
func wantCured(t *testing.T, r row, stock int, out string) {
	t.Helper()
	if r.oversold != 0 || r.drift != 0 || r.duplicates != 0 || r.orders+r.left != stock || r.left < 0 {
		t.Errorf("%s: orders %d, left %d, oversold %d, drift %d, duplicates %d; want no oversold, drift or duplicate and orders + left = %d\n%s",
			r.mode, r.orders, r.left, r.oversold, r.drift, r.duplicates, stock, out)
	}
}

// TestDemo_SmallSaleKeepsTheInvariants runs all four modes on the embedded
// backends. The unprotected modes may oversell (whether they do depends on
// timing); the guard modes never do, and in guard-lease locks really are
// lost and their writes refused.
func TestDemo_SmallSaleKeepsTheInvariants(t *testing.T) {
	t.Parallel()
	const stock = 30
	rows, out := runDemoCommand(t, nil,
		"-instances", "3", "-buyers", "240", "-stock", strconv.Itoa(stock), "-concurrency", "24",
		"-hold-delay", "150ms", "-hold-rate", "0.2", "-lease", "50ms", "-duration", "40s")
	t.Log("\n" + out)
	for _, mode := range []string{"none", "local", "guard", "guard-lease"} {
		r, ok := rows[mode]
		if !ok {
			t.Fatalf("no row for %s in\n%s", mode, out)
		}
		if r.duplicates != 0 || r.left < 0 {
			t.Errorf("%s: %d duplicate orders, stock left %d", mode, r.duplicates, r.left)
		}
	}
	for _, mode := range []string{"none", "local"} {
		if r := rows[mode]; r.refusedLockLost != "-" || r.refusedFence != "-" {
			t.Errorf("%s: stale columns %q %q, want - (no lock, no token)", mode, r.refusedLockLost, r.refusedFence)
		}
	}
	guard := rows["guard"]
	wantCured(t, guard, stock, out)
	if guard.orders != stock {
		t.Errorf("guard sold %d of %d units to 240 buyers", guard.orders, stock)
	}
	if guard.refusedLockLost != "0" || guard.refusedFence != "0" {
		t.Errorf("guard: stale writes %s/%s, want none: the watchdog keeps every lock", guard.refusedLockLost, guard.refusedFence)
	}
	lease := rows["guard-lease"]
	wantCured(t, lease, stock, out)
	if n, _ := strconv.Atoi(lease.refusedLockLost); n == 0 {
		t.Errorf("guard-lease: no write refused; the 150ms pauses should outlive the 50ms lease\n%s", out)
	}
	if !strings.Contains(out, "embedded miniredis") || !strings.Contains(out, "embedded SQLite in memory") {
		t.Errorf("the demo does not name its backends:\n%s", out)
	}
}

// TestDemo_RealServers runs the demo on redis-server and MariaDB, as with
// REDIS_URL and MYSQL_DSN set.
func TestDemo_RealServers(t *testing.T) {
	t.Parallel()
	rs := testenv.Redis(t)
	vars := map[string]string{envRedisURL: "redis://" + rs.Addr, envMySQLDSN: testenv.MySQL(t)}
	const stock = 25
	rows, out := runDemoCommand(t, vars,
		"-modes", "none,guard,guard-lease", "-instances", "3", "-buyers", "150", "-stock", strconv.Itoa(stock),
		"-concurrency", "16", "-hold-delay", "150ms", "-hold-rate", "0.2", "-lease", "50ms", "-duration", "40s")
	t.Log("\n" + out)
	if !strings.Contains(out, "(REDIS_URL)") || !strings.Contains(out, "(MYSQL_DSN)") {
		t.Errorf("the demo does not name the servers it used:\n%s", out)
	}
	if r := rows["none"]; r.duplicates != 0 {
		t.Errorf("none: %d duplicate orders", r.duplicates)
	}
	wantCured(t, rows["guard"], stock, out)
	if rows["guard"].orders != stock {
		t.Errorf("guard sold %d of %d units", rows["guard"].orders, stock)
	}
	wantCured(t, rows["guard-lease"], stock, out)
}

// TestDemo_LocalLocksOversell reproduces the oversold flash sale: three
// instances, each with its own in-process lock, and a pause between reading
// the stock and writing it. Overselling is a matter of timing, so the sale
// may run a few times; with a 100ms pause in every purchase it oversells on
// the first.
func TestDemo_LocalLocksOversell(t *testing.T) {
	t.Parallel()
	b := embedded(t)
	dc, err := parseDemo([]string{"-modes", "local", "-instances", "3", "-buyers", "60", "-stock", "10",
		"-concurrency", "30", "-hold-delay", "100ms", "-hold-rate", "1", "-repeat", "0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		results, err := runDemo(context.Background(), dc, b, builtinPolicies(t), io.Discard, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		r := results[0]
		t.Logf("attempt %d: %d orders for %d units, %d left, oversold %d, drift %d", attempt, r.orders, r.initial, r.stockLeft, r.oversold(), r.drift())
		if r.oversold() > 0 && r.drift() < 0 {
			return
		}
	}
	t.Error("three instances with local locks never oversold")
}

func TestDemo_RefusesNonsense(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-modes", "guard,redlock"}, "unknown mode"},
		{[]string{"-instances", "0"}, "at least 1"},
		{[]string{"-repeat", "2"}, "-repeat"},
		{[]string{"-duration", "0s"}, "-duration"},
		{[]string{"-hold-rate", "1.5"}, "-hold-rate"},
	} {
		if _, err := parseDemo(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("demo %q: err = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
	dc, err := parseDemo([]string{"-hold-delay", "40ms"}, io.Discard)
	if err != nil || dc.lease != 20*1000*1000 {
		t.Errorf("-lease left out: %v %v, want half of -hold-delay", dc, err)
	}
}

// TestDemo_OutputFitsEightyColumns: the tables, their legends and the
// progress line fit an 80-column terminal even with large numbers, and the
// output says whether any request was answered 429.
func TestDemo_OutputFitsEightyColumns(t *testing.T) {
	t.Parallel()
	results := []modeResult{
		{mode: ModeNone, initial: 100, requests: 123456, orders: 99999, stockLeft: 99999, elapsed: time.Second, p50: 999 * time.Millisecond, p99: 12 * time.Second, answers: map[string]int{"201": 99999}},
		{mode: ModeGuardLease, initial: 100, requests: 123456, orders: 100, duplicates: 99999, refusedLockLost: 99999, refusedFence: 99999,
			elapsed: time.Millisecond, p50: 9 * time.Millisecond, p99: 999 * time.Millisecond, answers: map[string]int{"201": 100, "429 busy": 7, "429 try_later": 5}, unsent: 12345},
	}
	var out bytes.Buffer
	printTable(&out, results)
	wantFits(t, out.String())
	if !strings.Contains(out.String(), "12 requests were answered 429") {
		t.Errorf("the output does not count the 429 answers:\n%s", out.String())
	}
	for _, r := range results {
		if !strings.Contains(out.String(), "\n  "+r.mode.legend()+"\n") {
			t.Errorf("the output does not say what mode %s does:\n%s", r.mode, out.String())
		}
	}
	out.Reset()
	printTable(&out, results[:1])
	if !strings.Contains(out.String(), "No request was answered 429.") {
		t.Errorf("the output does not say that nothing was answered 429:\n%s", out.String())
	}
	bar := -1
	for _, m := range allModes {
		for _, line := range []string{
			progressLine(string(m), 0, 99999, 0, 0),
			progressLine(string(m), 99999, 99999, 9999999, 9999*time.Second),
		} {
			if len(line) > progressWidth {
				t.Errorf("progress line of %d columns, want at most %d: %q", len(line), progressWidth, line)
			}
			if bar == -1 {
				bar = strings.Index(line, "[")
			}
			if i := strings.Index(line, "["); i != bar {
				t.Errorf("the bar of mode %s starts in column %d, the others' in %d: %q", m, i, bar, line)
			}
		}
	}
	for _, m := range allModes {
		if l := m.legend(); len(l)+2 > 80 {
			t.Errorf("the legend of mode %s is %d columns wide with its indent: %q", m, len(l)+2, l)
		}
	}
}

// wantFits fails for every line of out wider than 80 columns.
func wantFits(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > 80 {
			t.Errorf("line of %d columns: %q", n, line)
		}
	}
}

// TestDemo_TextRunFitsEightyColumns runs a small sale without -json: every
// line it prints, settings included, fits 80 columns.
func TestDemo_TextRunFitsEightyColumns(t *testing.T) {
	t.Parallel()
	var out, progress bytes.Buffer
	if err := run(context.Background(), []string{"demo", "-modes", "guard", "-buyers", "20", "-stock", "5", "-concurrency", "4"}, env(nil), &out, &progress); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	wantFits(t, out.String())
	wantFits(t, progress.String())
	if !strings.Contains(out.String(), "answered 429") || !strings.Contains(out.String(), "In the database after each sale") {
		t.Errorf("the text output lacks its tables or the 429 line:\n%s", out.String())
	}
}

// TestDemo_TheREADMEsSamplesAreWhatItPrints: every sample of the demo's
// tables in README.md and example-seckill/README.md says what each mode
// does, has a row for every mode in each of its tables, and has around its
// numbers the lines the demo prints now, headers and footnotes alike. A
// sample of an older demo (fewer modes, no legend, other columns) fails.
func TestDemo_TheREADMEsSamplesAreWhatItPrints(t *testing.T) {
	t.Parallel()
	var results []modeResult
	for _, m := range allModes {
		results = append(results, modeResult{mode: m, initial: 100, answers: map[string]int{}})
	}
	var out bytes.Buffer
	printTable(&out, results)
	rowMode := func(line string) (Mode, bool) {
		for _, m := range allModes {
			if strings.HasPrefix(line, string(m)+" ") {
				return m, true
			}
		}
		return "", false
	}
	columns := regexp.MustCompile(`\s{2,}`)
	var headers [][]string
	printed := map[string]bool{}
	for _, line := range strings.Split(out.String(), "\n") {
		switch _, isRow := rowMode(line); {
		case strings.HasPrefix(line, "mode "):
			headers = append(headers, columns.Split(line, -1))
		case !isRow:
			printed[line] = true
		}
	}
	summary := regexp.MustCompile(`^(No request was answered 429\.|\d+ requests were answered 429 \(busy\) and asked again\.)$`)

	for _, path := range []string{"README.md", "../README.md"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		samples := 0
		for _, block := range strings.Split(string(b), "```")[1:] {
			start := strings.Index(block, "The sales, one per mode:\n")
			if !strings.Contains(block, "In the database after each sale:\n") {
				continue
			}
			samples++
			if start < 0 {
				t.Errorf("%s: a sample of the demo without the line of each mode (\"The sales, one per mode:\"):\n%s", path, block)
				continue
			}
			tables, rows := 0, map[Mode]int{}
			for _, line := range strings.Split(strings.TrimRight(block[start:], "\n"), "\n") {
				m, isRow := rowMode(line)
				switch {
				case strings.HasPrefix(line, "mode "):
					if got := columns.Split(line, -1); tables >= len(headers) || !slices.Equal(got, headers[tables]) {
						t.Errorf("%s: table header %q; the demo prints %q", path, got, headers)
					}
					tables++
				case isRow:
					rows[m]++
				case !printed[line] && !summary.MatchString(line):
					t.Errorf("%s: the demo prints no line %q", path, line)
				}
			}
			for _, m := range allModes {
				if !strings.Contains(block, "\n  "+m.legend()+"\n") {
					t.Errorf("%s: a sample of the demo without the legend of mode %s", path, m)
				}
				if rows[m] != tables {
					t.Errorf("%s: mode %s has %d rows in a sample of %d tables", path, m, rows[m], tables)
				}
			}
		}
		if samples == 0 {
			t.Errorf("%s shows no sample of the demo's tables", path)
		}
	}
}

package main

// The go test -bench subset: the same scenarios as the command, sized by b.N.
// CI runs it once as a smoke test (-benchtime 1x), with no thresholds:
//
//	cd bench && go test -count=1 -run '^$' -bench . -benchtime 1x ./...

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

func benchEnv(b *testing.B) *env {
	srv := testenv.Redis(b)
	return &env{addr: srv.Addr, admin: srv.Client()}
}

// sub names a sub-benchmark after a contender.
func sub(c contender) string {
	r := strings.NewReplacer(", ", "-", " ", "", "(", "-", ")", "", "/", "-")
	return r.Replace(c.name)
}

// BenchmarkUncontended measures b.N uncontended Lock+Unlock cycles per
// library; ns/op is the median cycle.
func BenchmarkUncontended(b *testing.B) {
	e := benchEnv(b)
	for _, c := range contenders() {
		b.Run(sub(c), func(b *testing.B) {
			res, err := runUncontended(context.Background(), e, []contender{c}, b.N, 1, "bench:unc")
			if err != nil {
				b.Fatal(err)
			}
			u := res[c.name]
			n := float64(len(u.cycles))
			b.ReportMetric(percentile(u.cycles, 50), "ns/op")
			b.ReportMetric(float64(u.cost.sent)/n, "sent/op")
			b.ReportMetric(float64(u.cost.executed)/n, "redis-ran/op")
			b.ReportMetric(float64(u.cost.mallocs)/n, "mallocs/op")
			if err := e.reset(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkHotKey runs b.N acquisitions of one lock by 4 Clients × 16
// goroutines with a 200 µs critical section per library.
func BenchmarkHotKey(b *testing.B) {
	e := benchEnv(b)
	for _, c := range lockers(contenders()) {
		b.Run(sub(c), func(b *testing.B) {
			ld := load{clients: 4, goroutines: 16, keys: 1, hold: hotHold, count: int64(b.N)}
			x, err := runContended(context.Background(), e, c, ld, "bench:hot")
			if err != nil {
				b.Fatal(err)
			}
			n := float64(max(x.acquisitions, 1))
			b.ReportMetric(float64(x.window.Nanoseconds())/n, "ns/op")
			b.ReportMetric(float64(x.cost.sent)/n, "sent/acq")
			b.ReportMetric(float64(x.cost.executed)/n, "redis-ran/acq")
			b.ReportMetric(percentile(x.waits, 99)/1e6, "p99-wait-ms")
			if err := e.reset(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkHandoff measures b.N handoffs between two instances per library.
func BenchmarkHandoff(b *testing.B) {
	e := benchEnv(b)
	for _, c := range lockers(contenders()) {
		b.Run(sub(c), func(b *testing.B) {
			h, err := runHandoff(context.Background(), e, c, b.N, "bench:handoff")
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(percentile(h, 50), "ns/op")
			if err := e.reset(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkHeld holds 100 locks on one Client with a 300 ms watchdog timeout
// and counts the watchdog's round trips per renewal pass (one expected).
func BenchmarkHeld(b *testing.B) {
	e := benchEnv(b)
	const wd = 300 * time.Millisecond
	for range b.N {
		h, err := runHeld(context.Background(), e, 100, wd, wd+wd/6, "bench:held")
		if err != nil {
			b.Fatal(err)
		}
		if h.passes > 0 {
			b.ReportMetric(float64(h.roundTrips)/float64(h.passes), "roundtrips/pass")
		}
		b.ReportMetric(float64(h.heap)/float64(h.n), "heap-B/lock")
		b.ReportMetric(float64(h.lost), "lost")
		if err := e.reset(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHTTP builds example-seckill, starts it in every mode on a
// redis-server and a MariaDB database of its own, and sends b.N purchases
// per row (8 in flight, spread over 1,024 SKUs).
func BenchmarkHTTP(b *testing.B) {
	var sink bytes.Buffer
	h, err := startHTTP(context.Background(), "mysql", &sink)
	if err != nil {
		b.Fatal(err)
	}
	defer h.close()
	for _, row := range httpRows {
		b.Run(strings.NewReplacer(" ", "", ",", "-").Replace(row.name), func(b *testing.B) {
			ld := httpLoad{clients: min(8, b.N), skus: shapeSKUs(httpShapes[1]), idem: row.idem, count: int64(b.N)}
			x, err := runHTTP(context.Background(), h, h.services[row.mode], ld)
			if err != nil {
				b.Fatal(err)
			}
			if ok := x.answers["201"]; ok != b.N {
				b.Fatalf("%d of %d answered 201: %v", ok, b.N, x.answers)
			}
			b.ReportMetric(float64(x.window.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(percentile(x.latencies, 99)/1e6, "p99-ms")
			b.ReportMetric(float64(x.cost.executed)/float64(b.N), "redis-ran/req")
		})
	}
}

func TestPercentileIsNearestRank(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}} {
		if got := percentile(d, c.p); got != float64(c.want) {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestCellShowsMedianAndRange(t *testing.T) {
	if got := cell([]float64{3, 1, 2}, ""); got != "2.00 (1.00–3.00)" {
		t.Errorf("cell = %q", got)
	}
	if got := cell([]float64{5}, " ms"); got != "5.00 ms" {
		t.Errorf("cell = %q", got)
	}
	if got := cell(nil, ""); got != "—" {
		t.Errorf("cell = %q", got)
	}
}

func TestExpectedRoundTripsFollowTheBatching(t *testing.T) {
	for n, want := range map[int]int{1: 1, 100: 1, 10000: 1, 32768: 1, 32769: 2, 100000: 4} {
		if got := expectedRoundTrips(n); got != want {
			t.Errorf("expectedRoundTrips(%d) = %d, want %d", n, got, want)
		}
	}
}

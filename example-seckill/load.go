package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A sale is what the buyers of one mode do: every buyer wants one unit of
// the SKU and asks until they get an answer that settles it; some click
// twice.
type sale struct {
	urls        []string // the instances, served round-robin like a load balancer would
	sku         string
	buyers      int
	repeat      float64 // fraction of buyers who send a second request at once, with the same Idempotency-Key
	concurrency int     // requests in flight at once
	deadline    time.Time
	keyPrefix   string // makes this run's idempotency keys unique
	client      *http.Client
	progress    *progressBar
}

// A purchase is one click: a buyer and the Idempotency-Key of their attempt.
type purchase struct {
	user, key string
}

// saleResult is what the buyers saw. The demo's table takes orders and
// stock from the database; these are the requests and their latencies.
type saleResult struct {
	requests  int
	elapsed   time.Duration
	latencies []time.Duration
	answers   map[string]int // "201", "409 sold_out", ...
	unsent    int            // clicks not sent before the deadline
}

// run sends the clicks and waits for their answers. A buyer answered 429
// (busy) asks again with the same key after a short pause, and so does one
// answered 409 stale_write or lock_lost (the lock was lost, nothing was
// written): the guard never stores those answers for replay.
func (s *sale) run(ctx context.Context) saleResult {
	clicks := make(chan purchase, s.buyers*2)
	for i := range s.buyers {
		p := purchase{user: fmt.Sprintf("u%05d", i+1), key: fmt.Sprintf("%s-%d", s.keyPrefix, i+1)}
		clicks <- p
		if rand.Float64() < s.repeat {
			clicks <- p
		}
	}
	total := len(clicks)
	close(clicks)
	s.progress.start(total)

	var (
		mu     sync.Mutex
		res    = saleResult{answers: make(map[string]int)}
		next   atomic.Uint64
		wg     sync.WaitGroup
		begin  = time.Now()
		unsent atomic.Int64
	)
	for range s.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			answers := make(map[string]int)
			for p := range clicks {
				if ctx.Err() != nil || time.Now().After(s.deadline) {
					unsent.Add(1)
					s.progress.done()
					continue
				}
				for {
					url := s.urls[next.Add(1)%uint64(len(s.urls))]
					start := time.Now()
					answer := s.buy(ctx, url, p.user, p.key)
					lat = append(lat, time.Since(start))
					answers[answer]++
					s.progress.request()
					if ctx.Err() != nil || time.Now().After(s.deadline) {
						break
					}
					if answer == "429 busy" {
						time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
						continue
					}
					if answer == "409 stale_write" || answer == "409 lock_lost" {
						continue
					}
					break
				}
				s.progress.done()
			}
			mu.Lock()
			res.latencies = append(res.latencies, lat...)
			for k, v := range answers {
				res.answers[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(begin)
	res.requests = len(res.latencies)
	res.unsent = int(unsent.Load())
	s.progress.finish()
	return res
}

// buy sends one purchase and returns its answer as "<status> <error code>".
func (s *sale) buy(ctx context.Context, url, user, key string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/api/seckill/"+s.sku, nil)
	if err != nil {
		return "request error"
	}
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := s.client.Do(req)
	if err != nil {
		return "transport error"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return answerOf(resp.StatusCode, body)
}

// answerOf names an answer by its status and the "error" code of its body.
func answerOf(status int, body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if status >= 300 && json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Sprintf("%d %s", status, e.Error)
	}
	return fmt.Sprint(status)
}

// percentile returns the p-th percentile (0 < p < 1) of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// newClient returns the buyers' HTTP client: enough idle connections for
// every request in flight.
func newClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = concurrency * 4
	t.MaxIdleConnsPerHost = concurrency
	return &http.Client{Transport: t, Timeout: 30 * time.Second}
}

// progressBar draws the progress of a sale on one terminal line, or, when
// the writer is no terminal, writes one line when the sale is done.
type progressBar struct {
	w       io.Writer
	label   string
	live    bool
	total   int
	settled atomic.Int64
	sent    atomic.Int64
	begin   time.Time
	stop    chan struct{}
	stopped chan struct{}
}

func newProgressBar(w io.Writer, label string) *progressBar {
	live := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			live = true
		}
	}
	return &progressBar{w: w, label: label, live: live}
}

func (b *progressBar) start(total int) {
	b.total, b.begin = total, time.Now()
	b.stop, b.stopped = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(b.stopped)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				if b.live {
					b.draw("\r")
				}
			}
		}
	}()
}

func (b *progressBar) request() { b.sent.Add(1) }
func (b *progressBar) done()    { b.settled.Add(1) }

func (b *progressBar) finish() {
	close(b.stop)
	<-b.stopped
	if b.live {
		b.draw("\r")
		fmt.Fprintln(b.w)
		return
	}
	b.draw("")
	fmt.Fprintln(b.w)
}

// draw writes the progress line, at most progressWidth columns wide for
// sales of up to 99,999 clicks, so that a redraw after "\r" never wraps.
func (b *progressBar) draw(prefix string) {
	fmt.Fprint(b.w, prefix+progressLine(b.label, int(b.settled.Load()), b.total, b.sent.Load(), time.Since(b.begin)))
}

// progressWidth is the widest progress line: it fits an 80-column terminal
// with the cursor after it.
const progressWidth = 79

// progressLine formats one state of a sale's progress.
func progressLine(label string, settled, total int, sent int64, elapsed time.Duration) string {
	const width = 16
	filled := 0
	if total > 0 {
		filled = min(settled*width/total, width)
	}
	bar := strings.Repeat("#", filled) + strings.Repeat("-", width-filled)
	return fmt.Sprintf("  %-*s [%s] %5d/%-5d settled %7d requests %6.1fs",
		modeWidth, label, bar, settled, total, sent, elapsed.Seconds())
}

// sortedLatencies returns the latencies in increasing order.
func sortedLatencies(l []time.Duration) []time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s
}

package reliability

import (
	"bufio"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/testenv"
)

// seckillPackage is the reference flash-sale service.
const seckillPackage = "github.com/seckillguard/seckillguard/example-seckill"

// seckillProcess is one running instance of the reference service.
type seckillProcess struct {
	*faults.Process
	url string
}

var listening = regexp.MustCompile(`listening on (\S+),`)

// startSeckill runs the reference service's binary on a free port against
// REDIS_URL and MYSQL_DSN of env and waits until it listens.
func startSeckill(t *testing.T, bin string, env []string, args ...string) *seckillProcess {
	t.Helper()
	p := faults.StartWith(t, env, bin, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...)...)
	line := p.Await(30*time.Second, "the listening line", func(l []byte) bool { return listening.Match(l) })
	return &seckillProcess{Process: p, url: "http://" + string(listening.FindSubmatch(line)[1])}
}

// metric returns the sum of the samples of the counter name on the
// instance's /metrics whose labels contain labels.
func (p *seckillProcess) metric(t *testing.T, name, labels string) float64 {
	t.Helper()
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, labels) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// A holder paused past its lease, on the reference service: three example-seckill
// processes sell one SKU; one of them is frozen with SIGSTOP while it holds
// the SKU's lock, for longer than its watchdog timeout, and then resumed.
// The other two sell on; the resumed process's late writes are refused and
// counted in its metrics; nothing is oversold and no buyer has two orders.
func TestSeckill_InstancePausedMidSaleOversellsNothing(t *testing.T) {
	pausedMidSale(t, "guard")
}

// The same with the purchases of each process combined (mode
// guard-combine): the victim is frozen inside a batch, its transaction
// open; the batch's writes are refused when it resumes, and every buyer
// answered 201 holds an order.
func TestSeckill_CombiningInstancePausedMidSaleOversellsNothing(t *testing.T) {
	pausedMidSale(t, "guard-combine")
}

// pausedMidSale runs the sale of a paused instance in mode until the freeze
// catches the victim inside its critical section, at most pauseAttempts
// times. The test picks the moment from outside, by the victim's field in
// the lock hash and its fresh lease, and on a loaded machine the victim can
// have finished its write (and be on its way to Unlock) by the time SIGSTOP
// lands: then it has nothing late to refuse and loses the lock after its
// handler, which is not what the test is about. Every attempt is checked in
// full for what must always hold (the sale exact, no buyer with two orders,
// no instance in trouble); a victim whose loss or refused write goes
// unnoticed in every attempt fails the test.
func pausedMidSale(t *testing.T, mode string) {
	var missed []string
	for attempt := 1; attempt <= pauseAttempts; attempt++ {
		why := pausedMidSaleOnce(t, mode)
		if why == "" || t.Failed() {
			return
		}
		t.Logf("attempt %d of %d did not catch the victim in its critical section: %s", attempt, pauseAttempts, why)
		missed = append(missed, why)
	}
	for _, why := range missed {
		t.Error(why)
	}
}

// pauseAttempts bounds the sales pausedMidSale runs: on this 2-core machine
// about one freeze in twelve misses under the load of the whole suite.
const pauseAttempts = 3

// pausedMidSaleOnce runs one sale of pausedMidSale. It reports what the
// resumed victim failed to notice, or "" when its late write was refused and
// its loss counted.
func pausedMidSaleOnce(t *testing.T, mode string) string {
	const (
		sku      = "sku-1"
		stock    = 60
		buyers   = 150
		workers  = 12
		watchdog = time.Second
		pause    = 2500 * time.Millisecond
	)
	bin := binary(t, seckillPackage)
	srv := testenv.Redis(t)
	dsn := testenv.MySQL(t)
	env := []string{"REDIS_URL=redis://" + srv.Addr, "MYSQL_DSN=" + dsn}
	// The victim pauses longer between reading the stock and writing it,
	// so that it can be frozen inside that pause: frozen after its write,
	// it would have nothing late to refuse.
	// Combined, the victim's purchases pause 10ms each, so that its
	// batches (25ms of intake) hold several purchases and it is frozen
	// amid one, after some of them have run.
	var procs []*seckillProcess
	for i := range 3 {
		delay := "20ms"
		switch {
		case i == 1 && mode == "guard-combine":
			delay = "10ms"
		case i == 1:
			delay = "100ms"
		}
		procs = append(procs, startSeckill(t, bin, env, "-mode", mode, "-watchdog", watchdog.String(), "-hold-delay", delay))
	}
	resp, err := http.Post(procs[0].url+"/api/admin/products", "application/json",
		strings.NewReader(fmt.Sprintf(`{"sku":%q,"name":"reliability","stock":%d}`, sku, stock)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("resetting the product: %d", resp.StatusCode)
	}
	victim := procs[1]
	owner := lockOwner(t, srv, victim.url, sku) // the victim's lock client id
	res := &saleResult{statuses: make(map[string]int), ordered: []string{"probe"}}

	var paused sync.WaitGroup
	var once sync.Once
	var stoppedFor time.Duration
	urls := []string{procs[0].url, procs[1].url, procs[2].url}
	sale := sell(t, urls, sku, buyers, workers, func(done int) {
		if done < buyers/6 {
			return
		}
		once.Do(func() {
			paused.Add(1)
			go func() {
				defer paused.Done()
				// Freeze the victim while it holds the SKU's lock, within
				// 50 ms of taking it: inside its 100 ms pause, before its
				// write.
				deadline := time.Now().Add(10 * time.Second)
				for !heldBy(t, srv, "sku:"+sku, owner) || !takenWithin(srv, "sku:"+sku, watchdog, 50*time.Millisecond) {
					if time.Now().After(deadline) {
						t.Error("the victim never held the lock during the sale")
						return
					}
					time.Sleep(200 * time.Microsecond)
				}
				victim.Stop()
				start := time.Now()
				time.Sleep(pause)
				victim.Cont()
				stoppedFor = time.Since(start)
			}()
		})
	})
	paused.Wait()
	res.ordered = append(res.ordered, sale.ordered...)
	res.statuses = sale.statuses

	db := openPlain(t, dsn)
	orders := checkSaleIn(t, db, "products", "orders", sku, stock, res)
	late := victim.metric(t, "seckill_stale_writes_refused_total", "")
	lost := victim.metric(t, "seckillguard_lock_lost_total", "")
	t.Logf("victim frozen %v holding the lock; %d orders of %d units; the victim refused %v late writes and lost %v locks; answers %v",
		stoppedFor.Round(time.Millisecond), orders, stock, late, lost, sale.statuses)
	// Combined, the late writes may all have been sent before the victim
	// learnt of the loss: then its batch's COMMIT is what is refused, and
	// the batch's buyers are answered lock_lost.
	refusedCommit := mode == "guard-combine" && sale.statuses["409 lock_lost"]+sale.statuses["409 stale_write"] > 0
	var missed []string
	if late < 1 && !refusedCommit {
		missed = append(missed, fmt.Sprintf("the resumed victim counted %v refused writes, want its late write refused and counted", late))
	}
	if lost < 1 {
		missed = append(missed, fmt.Sprintf("the resumed victim lost %v locks, want the frozen hold lost", lost))
	}
	if orders != stock {
		t.Errorf("%d orders for %d units and %d buyers: the sale did not go on", orders, stock, buyers)
	}
	for _, p := range procs {
		if s := p.Stderr(); strings.Contains(s, "panic") || strings.Contains(s, "DATA RACE") {
			t.Errorf("an instance reported trouble:\n%s", s)
		}
	}
	return strings.Join(missed, "; ")
}

// lockOwner buys one unit through the instance at url, alone, and returns
// the lock client id ("<uuid>:") that held the SKU's lock meanwhile.
func lockOwner(t *testing.T, srv *testenv.RedisServer, url, sku string) string {
	t.Helper()
	rdb := srv.Client()
	found := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			fields, _ := rdb.HKeys(t.Context(), "sku:"+sku).Result()
			if len(fields) == 1 {
				if i := strings.LastIndexByte(fields[0], ':'); i > 0 {
					found <- fields[0][:i+1]
					return
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	req, _ := http.NewRequest(http.MethodPost, url+"/api/seckill/"+sku, nil)
	req.Header.Set("X-User-ID", "probe")
	resp, err := http.DefaultClient.Do(req)
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("probe purchase: %d", resp.StatusCode)
	}
	select {
	case o := <-found:
		return o
	default:
		t.Fatal("the probe purchase's lock was never seen in Redis")
		return ""
	}
}

// heldBy reports whether the lock hash key has a field of owner.
// takenWithin reports whether the lock key, renewed by a watchdog of
// timeout lease, was taken (or last renewed) less than d ago.
func takenWithin(srv *testenv.RedisServer, key string, lease, d time.Duration) bool {
	pttl, _ := srv.Do("PTTL", key).(int64)
	return time.Duration(pttl)*time.Millisecond > lease-d
}

func heldBy(t *testing.T, srv *testenv.RedisServer, key, owner string) bool {
	fields, _ := srv.Do("HKEYS", key).([]any)
	for _, f := range fields {
		if s, _ := f.(string); strings.HasPrefix(s, owner) {
			return true
		}
	}
	return false
}

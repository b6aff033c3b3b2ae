// Package faults injects the failures a distributed lock must survive: a TCP
// proxy that slows, stalls, drops and resets the connections between clients
// and a redis-server, and helpers that run a real holder process and freeze
// it with SIGSTOP, as a stop-the-world pause longer than a lease would.
//
// Every fault is switched on and off at runtime, from the test, while
// traffic flows. Nothing here skips a test: a missing binary or server fails
// it with one line that says what is missing.
package faults

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// A Proxy forwards TCP connections from Addr to a target address and
// injects faults into them on command. Its zero faults make it a plain
// relay. A Proxy is safe for concurrent use; Close stops it and waits for
// every goroutine it started.
type Proxy struct {
	Addr string // "127.0.0.1:<port>": point the clients here

	target string
	ln     net.Listener

	mu        sync.Mutex
	latency   time.Duration // added to every chunk in each direction
	resetRate float64       // probability that forwarding a chunk resets its connection instead
	blackhole bool          // nothing is delivered while set; data waits
	refuse    bool          // new connections are closed at once, open ones were closed
	heal      chan struct{} // closed when the blackhole is lifted
	links     map[*link]struct{}
	closed    bool
	loss      *replyLoss // armed by LoseReplyTo

	stats struct {
		accepted, refused, resets, chunks atomic.Int64
	}

	wg sync.WaitGroup
}

// NewProxy starts a proxy in front of target on a free loopback port.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faults: proxy listen: %w", err)
	}
	p := &Proxy{
		Addr:   ln.Addr().String(),
		target: target,
		ln:     ln,
		heal:   make(chan struct{}),
		links:  make(map[*link]struct{}),
	}
	close(p.heal) // no blackhole yet
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetLatency delays every chunk of data by d in each direction, so a
// request and its reply take 2d longer. Order is kept; a chunk read after
// the change gets the new delay. 0 turns it off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// SetResetRate makes each chunk about to be forwarded, in either direction,
// reset its connection (both sides get a TCP RST) with probability rate
// instead. A reset on the way to the server loses the command; one on the
// way back loses the reply of a command that ran. 0 turns it off.
func (p *Proxy) SetResetRate(rate float64) {
	p.mu.Lock()
	p.resetRate = rate
	p.mu.Unlock()
}

// SetBlackhole stops delivering data while on: connections stay open, new
// ones are accepted, bytes are read and held, nothing arrives, as when a
// route drops every packet. Turned off, the held data is delivered in order,
// as TCP retransmission would once the route heals; clients that gave up
// meanwhile find their connection closed by their own timeouts.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.blackhole {
		return
	}
	p.blackhole = on
	if on {
		p.heal = make(chan struct{})
	} else {
		close(p.heal)
	}
}

// SetDrop, while on, closes every open connection and every new one at once
// (an orderly close, the client reads EOF), as a restarting load balancer
// would. Off, connections are forwarded again.
func (p *Proxy) SetDrop(on bool) {
	p.mu.Lock()
	p.refuse = on
	var open []*link
	if on {
		for l := range p.links {
			open = append(open, l)
		}
	}
	p.mu.Unlock()
	for _, l := range open {
		l.close(false)
	}
}

// ResetAll resets every open connection now (both sides get a TCP RST).
// New connections are forwarded as before.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	open := make([]*link, 0, len(p.links))
	for l := range p.links {
		open = append(open, l)
	}
	p.mu.Unlock()
	for _, l := range open {
		p.stats.resets.Add(1)
		l.close(true)
	}
}

// replyLoss is an armed LoseReplyTo.
type replyLoss struct {
	match   func([]byte) bool
	arrived func()
	lost    chan struct{} // closed once the reply was lost
}

// LoseReplyTo arms a one-shot fault: the next chunk on its way to the target
// that match accepts is delivered, and the connection it came on is reset
// (both sides get a TCP RST) instead of delivering the target's next reply.
// The target receives and runs the command; the client never learns how it
// went — a COMMIT that committed while its answer was lost. arrived, unless
// nil, runs once just before the command is delivered. The returned channel
// closes when the reply has been lost. match sees every chunk to the target,
// one at a time, until it accepts one; Containing builds the common one.
func (p *Proxy) LoseReplyTo(match func(chunk []byte) bool, arrived func()) <-chan struct{} {
	l := &replyLoss{match: match, arrived: arrived, lost: make(chan struct{})}
	p.mu.Lock()
	p.loss = l
	p.mu.Unlock()
	return l.lost
}

// Containing returns a LoseReplyTo matcher for the chunks that contain
// pattern.
func Containing(pattern []byte) func([]byte) bool {
	pattern = append([]byte(nil), pattern...)
	return func(chunk []byte) bool { return bytes.Contains(chunk, pattern) }
}

// ProxyStats counts what a Proxy did.
type ProxyStats struct {
	Accepted int64 // connections forwarded
	Refused  int64 // connections closed at once while dropping
	Resets   int64 // connections reset, by SetResetRate or ResetAll
	Chunks   int64 // chunks of data delivered
	Open     int   // connections open now
}

// Stats returns the counts so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	open := len(p.links)
	p.mu.Unlock()
	return ProxyStats{
		Accepted: p.stats.accepted.Load(),
		Refused:  p.stats.refused.Load(),
		Resets:   p.stats.resets.Load(),
		Chunks:   p.stats.chunks.Load(),
		Open:     open,
	}
}

// Close stops accepting, closes every connection and waits until all of the
// proxy's goroutines have returned. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	open := make([]*link, 0, len(p.links))
	for l := range p.links {
		open = append(open, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range open {
		l.close(false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			p.stats.refused.Add(1)
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

// serve dials the target for one client connection and relays both ways.
func (p *Proxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: 2 * time.Second}
	sc, err := d.Dial("tcp", p.target)
	if err != nil {
		// The target is down: the client sees its connection reset, as it
		// would dialing the target itself.
		_ = client.SetLinger(0)
		client.Close()
		return
	}
	l := &link{p: p, client: client, server: sc.(*net.TCPConn), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.refuse {
		p.mu.Unlock()
		l.close(false)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	p.stats.accepted.Add(1)

	toServer := make(chan chunk, 256)
	toClient := make(chan chunk, 256)
	p.wg.Add(4)
	go l.read(client, toServer)
	go l.read(l.server, toClient)
	go l.write(l.server, toServer)
	go l.write(client, toClient)
	<-l.done
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// A link is one client connection and its connection to the target.
type link struct {
	p      *Proxy
	client *net.TCPConn
	server *net.TCPConn
	once   sync.Once
	done   chan struct{} // closed when the link is closed

	loseNext atomic.Pointer[replyLoss] // the next reply to the client is lost
}

// chunk is data read from one side, due for delivery to the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// close closes both connections, with an RST when reset is set.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		if reset {
			_ = l.client.SetLinger(0)
			_ = l.server.SetLinger(0)
		}
		l.client.Close()
		l.server.Close()
		close(l.done)
	})
}

// read reads from src into out, stamping each chunk with its due time.
func (l *link) read(src *net.TCPConn, out chan<- chunk) {
	defer l.p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.p.mu.Lock()
			due := time.Now().Add(l.p.latency)
			l.p.mu.Unlock()
			c := chunk{data: append([]byte(nil), buf[:n]...), due: due}
			select {
			case out <- c:
			case <-l.done:
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				l.close(false)
			} else {
				l.close(true)
			}
			return
		}
	}
}

// write delivers the chunks of in to dst when they are due, unless a
// blackhole holds them or a reset is drawn.
func (l *link) write(dst *net.TCPConn, in <-chan chunk) {
	defer l.p.wg.Done()
	for {
		var c chunk
		select {
		case c = <-in:
		case <-l.done:
			return
		}
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
		}
		l.p.mu.Lock()
		heal := l.p.heal
		l.p.mu.Unlock()
		select {
		case <-heal:
		case <-l.done:
			return
		}
		l.p.mu.Lock()
		rate := l.p.resetRate
		loss := l.p.loss
		if loss != nil && dst == l.server && loss.match(c.data) {
			l.p.loss = nil // one shot; armed on this link below
		} else {
			loss = nil
		}
		l.p.mu.Unlock()
		if loss != nil {
			// Armed before the command leaves, so that its reply, the
			// next chunk back, cannot slip through first.
			l.loseNext.Store(loss)
			if loss.arrived != nil {
				loss.arrived()
			}
		}
		if dst == l.client {
			if lost := l.loseNext.Load(); lost != nil {
				l.p.stats.resets.Add(1)
				close(lost.lost)
				l.close(true)
				return
			}
		}
		if rate > 0 && rand.Float64() < rate {
			l.p.stats.resets.Add(1)
			l.close(true)
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.close(true)
			return
		}
		l.p.stats.chunks.Add(1)
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/lock"
)

// serve runs one instance of the service until ctx ends.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: example-seckill [serve] [flags]\n\nServes the flash-sale service. REDIS_URL and MYSQL_DSN select real servers;\nunset, it embeds miniredis and SQLite. ADDR sets the default of -addr.\n\nflags:")
		printFlags(fs.Output(), fs)
	}
	defAddr := getenv(envAddr)
	if defAddr == "" {
		defAddr = defaultAddr
	}
	addr := fs.String("addr", defAddr, "listen `host:port`; port 0 picks a free one, \":8080\" listens on every interface")
	modeName := fs.String("mode", string(ModeGuard), "none, local, guard, guard-lease or guard-combine (help demo says what each does)")
	var k knobs
	k.register(fs, knobs{holdRate: 1, watchdog: lock.DefaultWatchdogTimeout, lease: 5 * time.Second})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	mode, err := parseMode(*modeName)
	if err != nil {
		return err
	}
	if err := k.check(); err != nil {
		return err
	}
	pol, polName, err := k.loadPolicies()
	if err != nil {
		return err
	}

	b, err := OpenBackends(getenv, k.sqlite)
	if err != nil {
		return err
	}
	defer b.Close()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	in, err := startInstance(ctx, b, k.config(mode, pol, log), *addr, true)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, banner(boundAddr(in.ln.Addr()), hostPort(in.ln.Addr()), mode, b, polName))

	select {
	case <-ctx.Done():
	case err = <-in.served:
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cerr := in.close(shutdown); err == nil {
		err = cerr
	}
	return err
}

// bannerLines is how many lines banner has.
const bannerLines = 5

// banner is what serve prints once it listens: a first line short enough to
// read at a glance, naming the address bound (scripts and tests take it from
// "listening on ADDR,"), then the backends and the policies, and a purchase
// to try, each on a line of its own.
func banner(addr, hostPort string, mode Mode, b *Backends, policies string) string {
	return fmt.Sprintf("example-seckill: listening on %s, mode %s\n"+
		"  Redis:    %s\n"+
		"  database: %s\n"+
		"  policies: %s\n"+
		"  try:      curl -X POST -H 'X-User-ID: u1' %s/api/seckill/sku-1\n",
		addr, mode, b.Redis, b.Database, policies, hostPort)
}

// instance is the service running on a listener, with its own Redis
// client, database pool and gin engine.
type instance struct {
	svc    *Service
	srv    *http.Server
	ln     net.Listener
	rdb    *redis.Client
	db     *gorm.DB
	url    string     // http://host:port
	served chan error // the server's end, if it ends by itself
}

// startInstance listens on addr, opens a client and a pool on b, creates
// the schema when asked, and serves the service.
func startInstance(ctx context.Context, b *Backends, cfg Config, addr string, createSchema bool) (*instance, error) {
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	in := &instance{ln: ln, rdb: b.NewRedis(), served: make(chan error, 1)}
	fail := func(err error) (*instance, error) {
		_ = in.ln.Close()
		_ = in.rdb.Close()
		if in.db != nil {
			closeDB(in.db)
		}
		if in.svc != nil {
			_ = in.svc.Close()
		}
		return nil, err
	}
	db, err := b.OpenDB()
	if err != nil {
		return fail(err)
	}
	in.db = db
	if err := ping(ctx, in.rdb, db); err != nil {
		return fail(err)
	}
	if createSchema {
		if err := migrate(ctx, db); err != nil {
			return fail(err)
		}
	}
	if in.svc, err = NewService(cfg, in.rdb, db); err != nil {
		return fail(err)
	}
	in.url = "http://" + hostPort(in.ln.Addr())
	in.srv = &http.Server{Handler: in.svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		err := in.srv.Serve(in.ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		in.served <- err
	}()
	return in, nil
}

// close drains the server (requests in flight finish) and closes what the
// instance opened.
func (in *instance) close(ctx context.Context) error {
	err := in.srv.Shutdown(ctx)
	if err != nil {
		_ = in.srv.Close()
	}
	in.release()
	return err
}

// stop closes the server and its connections at once, for when no request
// is in flight (a connection a client dialed and never used would hold up
// Shutdown for 5s), and closes what the instance opened.
func (in *instance) stop() {
	_ = in.srv.Close()
	in.release()
}

func (in *instance) release() {
	_ = in.svc.Close()
	_ = in.rdb.Close()
	closeDB(in.db)
}

// The listen address: ADDR, else defaultAddr; -addr overrides both.
const (
	envAddr     = "ADDR"
	defaultAddr = "127.0.0.1:8080" // loopback: a demo shop is no public service
)

// listen listens on addr. An address in use is answered with how to pick
// another.
func listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		other := "127.0.0.1:8081"
		if host, port, serr := net.SplitHostPort(addr); serr == nil {
			if n, perr := strconv.Atoi(port); perr == nil && n > 0 && n < 65535 {
				other = net.JoinHostPort(host, strconv.Itoa(n+1))
			}
		}
		return nil, fmt.Errorf("listen on %s: the address is in use (another instance of the service?); pick another with -addr %s or ADDR=%s, or port 0 for any free one: %w", addr, other, other, err)
	}
	return nil, fmt.Errorf("listen on %s: %w", addr, err)
}

// boundAddr names the address a listener is bound to, saying so when it is
// every interface.
func boundAddr(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return a.String() + ", every interface"
	}
	return a.String()
}

// Command example-seckill is the reference flash-sale service of
// seckillguard, and a demo that reproduces the incident the framework exists
// for: a sale split across three instances, each with its own in-process
// lock, selling more units than it has.
//
//	go run ./example-seckill         # serve on 127.0.0.1:8080 (ADDR or -addr: elsewhere)
//	go run ./example-seckill demo    # the incident, then the cure, in two tables
//	go run ./example-seckill help    # the commands; help serve, help demo: their flags
//
// With REDIS_URL and MYSQL_DSN unset it runs on embedded backends: miniredis
// in the process and SQLite in memory (pure Go), so it needs nothing but Go.
// With them set it uses those servers.
//
// The purchase (POST /api/seckill/:sku) is the usual flash-sale handler: read the
// stock, check it, deduct it in the application, create the order, inside a
// distributed lock on the SKU taken by the policies of guard.yaml. The row is
// read with SELECT ... FOR UPDATE in the transaction that writes it, and the
// writes are fenced with the lock's token (gormplugin), so a holder that lost
// its lock cannot write; unique indexes allow one order per user and SKU and
// per idempotency key.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/seckillguard/seckillguard/guard"
)

// defaultPolicies is guard.yaml, built in so that the service runs from any
// directory; -policies FILE replaces it.
//
//go:embed guard.yaml
var defaultPolicies []byte

func init() {
	// No route listing and debug banner on stdout.
	gin.SetMode(gin.ReleaseMode)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "example-seckill:", err)
		os.Exit(1)
	}
}

// usage lists the commands; "help serve" and "help demo" list their flags.
const usage = `usage: example-seckill [command] [flags]

The reference flash-sale service of seckillguard.

commands:
  serve   serve the shop over HTTP (the default), on 127.0.0.1:8080
          unless ADDR or -addr says otherwise
  demo    sell one SKU on three instances once per mode, from the
          oversold sale to its cure, and print what the database holds
  help    print this; "help serve" and "help demo" print their flags

REDIS_URL and MYSQL_DSN select real servers; unset, both commands run on
an embedded Redis (miniredis) and SQLite in memory.
`

// run runs the command named by args[0] (serve when args start with a flag
// or are empty) until it is done or ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	switch {
	case len(args) > 0 && isHelpFlag(args[0]):
		cmd, args = "help", args[1:]
	case len(args) > 0 && !strings.HasPrefix(args[0], "-"):
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, getenv, stdout, stderr)
	case "demo":
		return demo(ctx, args, getenv, stdout, stderr)
	case "help":
		return help(ctx, args, getenv, stdout)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q: want serve, demo or help", cmd)
}

// help prints the usage, or the flags of the command args name, on stdout.
func help(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		return nil
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, []string{"-h"}, getenv, stdout, stdout)
	case "demo":
		err = demo(ctx, []string{"-h"}, getenv, stdout, stdout)
	default:
		return fmt.Errorf("help %s: no such command; want serve or demo", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		err = nil
	}
	return err
}

func isHelpFlag(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

// knobs are the settings of every instance, in serve and demo alike.
type knobs struct {
	holdDelay time.Duration
	holdRate  float64
	policies  string
	watchdog  time.Duration
	lease     time.Duration
	sqlite    string
}

func (k *knobs) register(fs *flag.FlagSet, def knobs) {
	fs.DurationVar(&k.holdDelay, "hold-delay", def.holdDelay, "pause inside the critical section, after the stock is read and before it is written (a stand-in for a GC pause or a slow call)")
	fs.Float64Var(&k.holdRate, "hold-rate", def.holdRate, "fraction of purchases that pause for -hold-delay, in (0, 1]")
	fs.StringVar(&k.policies, "policies", def.policies, "policy `file` of the guard modes (default: the built-in copy of example-seckill/guard.yaml)")
	fs.DurationVar(&k.watchdog, "watchdog", def.watchdog, "lock watchdog timeout: a lock is renewed every third of it while held; also the in-progress lease of idempotency keys")
	fs.DurationVar(&k.lease, "lease", def.lease, "fixed lock lease of mode guard-lease (the watchdog is off for it)")
	fs.StringVar(&k.sqlite, "sqlite", def.sqlite, "with MYSQL_DSN unset: keep the SQLite database in this `file` instead of in memory")
}

// printFlags writes the flags of fs as flag.PrintDefaults does, a flag's
// name on one line and its usage and default below it, wrapped to fit 80
// columns.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	const indent = "        "
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		head := "  -" + f.Name
		if name != "" {
			head += " " + name
		}
		fmt.Fprintln(w, head)
		if def := defaultOf(f); def != "" {
			usage += " (default " + def + ")"
		}
		for _, line := range wrap(usage, 80-len(indent)) {
			fmt.Fprintln(w, indent+line)
		}
	})
}

// defaultOf is f's default as flag.PrintDefaults shows it: quoted for a
// string, nothing for a zero value.
func defaultOf(f *flag.Flag) string {
	switch f.DefValue {
	case "", "0", "false", "0s":
		return ""
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if _, isString := g.Get().(string); isString {
			return strconv.Quote(f.DefValue)
		}
	}
	return f.DefValue
}

// wrap breaks text into lines of at most width columns at spaces; a word
// longer than width stands on a line of its own.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// config returns the instance configuration of mode.
func (k *knobs) config(mode Mode, pol *guard.Policies, log *slog.Logger) Config {
	return Config{
		Mode: mode, Policies: pol, Watchdog: k.watchdog, Lease: k.lease,
		HoldDelay: k.holdDelay, HoldRate: k.holdRate, Logger: log,
	}
}

func (k *knobs) check() error {
	switch {
	case k.holdDelay < 0:
		return fmt.Errorf("-hold-delay %v: must not be negative", k.holdDelay)
	case k.holdRate <= 0 || k.holdRate > 1:
		return fmt.Errorf("-hold-rate %v: want a fraction in (0, 1]", k.holdRate)
	case k.watchdog < 30*time.Millisecond:
		return fmt.Errorf("-watchdog %v: want at least 30ms", k.watchdog)
	case k.lease <= 0:
		return fmt.Errorf("-lease %v: must be positive", k.lease)
	}
	return nil
}

// loadPolicies reads -policies, or the built-in guard.yaml. The second
// result names where they came from.
func (k *knobs) loadPolicies() (*guard.Policies, string, error) {
	if k.policies != "" {
		p, err := guard.LoadPolicies(k.policies)
		return p, k.policies, err
	}
	p, err := guard.ParsePolicies("guard.yaml (built in)", defaultPolicies)
	return p, "guard.yaml (built in)", err
}

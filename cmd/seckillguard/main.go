// Command seckillguard looks at the locks of a Redis deployment the way
// package lock sees them, without knowing Redisson's hash layout:
//
//	seckillguard inspect NAME        who holds NAME, its hold counts, lease, token and waiters
//	seckillguard list PATTERN        the locks whose names match a glob (SCAN, bounded)
//	seckillguard force-unlock -yes NAME
//	                                 delete a stuck Mutex or FairMutex, printing what it removed
//
// REDIS_URL names the deployment: redis://[user:password@]host:port[/db]
// (rediss:// for TLS); with ?master_name=NAME&addr=host:port... it is a
// Sentinel set, and with -cluster a Redis Cluster. Unset, it is
// redis://127.0.0.1:6379/0, the server redis-cli talks to by default.
// Every command takes -json for scripts and -namespace for Clients created
// with lock.WithNamespace (or guard.WithNamespace): NAME is then the name
// the code locks ("sku:42"); without it, the full key a log line shows
// ("ns:sku:42") names the same lock. Flags may come before or after the
// command and its argument. inspect and list only read.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/seckillguard/seckillguard/lock"
)

const usage = `usage: seckillguard COMMAND [flags] ARG

commands:
  inspect NAME          who holds the lock NAME, with which hold counts, the
                        lease left, the fencing counter and who waits; NAME
                        is the full key a log line shows ("ns:sku:42"), or
                        the name the code locks with -namespace ns
  list PATTERN          the locks whose names match the glob PATTERN (SCAN,
                        at most -limit of them), one line each
  force-unlock NAME     delete the Mutex or FairMutex NAME whoever holds it
                        and wake its waiters; needs -yes; prints what it
                        removed. The holder learns at its next renewal.

flags (before or after the command): -json  -namespace NS  -cluster
  -limit N (list, default 100)  -yes (force-unlock)

REDIS_URL names the Redis: redis://host:port/db, rediss:// for TLS,
?master_name=NAME&addr=host:port for Sentinel, -cluster for a Cluster.
Unset, it is ` + defaultRedisURL + ` (as redis-cli).
`

// defaultRedisURL is the Redis of an unset REDIS_URL: redis-cli's default
// server.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs the command of args and returns the exit code: 0, 1 when the
// command failed, 2 for a command line that makes no sense. Every error is
// printed once, on stderr.
func execute(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := run(ctx, args, getenv, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "seckillguard:", err)
		fmt.Fprintln(stderr, "seckillguard help lists the commands and flags")
		return 2
	}
	fmt.Fprintln(stderr, "seckillguard:", err)
	return 1
}

// errUsage marks a command line that makes no sense.
var errUsage = errors.New("usage")

// settings are the flags every command shares.
type settings struct {
	json      bool
	namespace string
	cluster   bool
	limit     int
	yes       bool
}

// run runs the command of args. Usage errors are returned, not printed.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var s settings
	fs := flag.NewFlagSet("seckillguard", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the caller prints the error, once
	fs.Usage = func() {}
	fs.BoolVar(&s.json, "json", false, "print JSON instead of text")
	fs.StringVar(&s.namespace, "namespace", "", "the namespace of lock.WithNamespace")
	fs.BoolVar(&s.cluster, "cluster", false, "REDIS_URL names a Redis Cluster node")
	fs.IntVar(&s.limit, "limit", 100, "list: at most this many locks")
	fs.BoolVar(&s.yes, "yes", false, "force-unlock: really delete the lock")
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return err
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if len(pos) == 0 {
		fmt.Fprint(stdout, usage)
		return fmt.Errorf("%w: no command", errUsage)
	}
	cmd, pos := pos[0], pos[1:]
	switch cmd {
	case "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "inspect", "list", "force-unlock":
	default:
		return fmt.Errorf("%w: unknown command %q (want inspect, list or force-unlock)", errUsage, cmd)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set["limit"] && cmd != "list":
		return fmt.Errorf("%w: -limit is a flag of list, not of %s", errUsage, cmd)
	case set["yes"] && cmd != "force-unlock":
		return fmt.Errorf("%w: -yes is a flag of force-unlock, not of %s", errUsage, cmd)
	case s.limit < 1:
		return fmt.Errorf("%w: -limit %d: want at least 1", errUsage, s.limit)
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: %s takes one argument, got %d", errUsage, cmd, len(pos))
	}
	rdb, err := connect(getenv("REDIS_URL"), s.cluster)
	if err != nil {
		return err
	}
	defer rdb.Close()
	var opts []lock.Option
	if s.namespace != "" {
		opts = append(opts, lock.WithNamespace(s.namespace))
	}
	locks := lock.New(rdb, opts...)
	defer locks.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch cmd {
	case "inspect":
		return inspect(ctx, locks, pos[0], s, stdout)
	case "list":
		return list(ctx, locks, pos[0], s, stdout)
	default:
		return forceUnlock(ctx, locks, pos[0], s, stdout)
	}
}

// parseInterleaved parses the flags of args wherever they stand, before,
// between or after the positional arguments, which it returns in order.
// After "--" every argument is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// connect opens the Redis of REDIS_URL.
func connect(raw string, cluster bool) (redis.UniversalClient, error) {
	if raw == "" {
		raw = defaultRedisURL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: REDIS_URL: %v", errUsage, err)
	}
	switch {
	case cluster:
		o, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: REDIS_URL as a Cluster: %v", errUsage, err)
		}
		return redis.NewClusterClient(o), nil
	case u.Query().Has("master_name"):
		o, err := redis.ParseFailoverURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: REDIS_URL as Sentinel: %v", errUsage, err)
		}
		return redis.NewFailoverClient(o), nil
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: REDIS_URL: %v", errUsage, err)
	}
	return redis.NewClient(o), nil
}

func inspect(ctx context.Context, locks *lock.Client, name string, s settings, w io.Writer) error {
	in, err := locks.Inspect(ctx, name)
	if err != nil {
		return err
	}
	if s.json {
		return writeJSON(w, report(in))
	}
	printInspection(w, in)
	if !in.Held() && s.namespace != "" && strings.HasPrefix(name, s.namespace+":") {
		// A full key pasted from a log, with the namespace given again.
		fmt.Fprintf(w, "  (%s already starts with the namespace %q:\n  for that key, leave -namespace out)\n", name, s.namespace)
	}
	return nil
}

func list(ctx context.Context, locks *lock.Client, pattern string, s settings, w io.Writer) error {
	names, err := locks.Scan(ctx, pattern, s.limit)
	if err != nil {
		return err
	}
	var ins []*lock.Inspection
	for _, n := range names {
		in, err := locks.Inspect(ctx, n)
		if err != nil {
			if errors.Is(err, lock.ErrInvalid) {
				continue // a key of another kind or an unusable name
			}
			return err
		}
		if in.Kind != lock.KindNone {
			ins = append(ins, in)
		}
	}
	if s.json {
		out := make([]lockReport, len(ins))
		for i, in := range ins {
			out[i] = report(in)
		}
		return writeJSON(w, out)
	}
	printList(w, ins, s.limit)
	return nil
}

func forceUnlock(ctx context.Context, locks *lock.Client, name string, s settings, w io.Writer) error {
	if !s.yes {
		return fmt.Errorf("%w: force-unlock deletes %q whoever holds it (the holder learns at its next renewal, and its fenced writes are refused): add -yes to do it", errUsage, name)
	}
	in, err := locks.Inspect(ctx, name)
	if err != nil {
		return err
	}
	switch in.Kind {
	case lock.KindNone:
		if s.json {
			return writeJSON(w, unlockReport{Removed: false, Lock: report(in)})
		}
		fmt.Fprintf(w, "%s is not held: nothing removed\n", name)
		return nil
	case lock.KindMutex:
	default:
		return fmt.Errorf("force-unlock removes Mutex and FairMutex locks; %s is a %s", name, in.Kind)
	}
	removed, err := locks.Mutex(name).ForceUnlock(ctx)
	if err != nil {
		return err
	}
	if s.json {
		return writeJSON(w, unlockReport{Removed: removed, Lock: report(in)})
	}
	if !removed {
		fmt.Fprintf(w, "%s was released meanwhile: nothing removed\n", name)
		return nil
	}
	fmt.Fprintf(w, "removed %s (key %s), its lease %s, held by:\n", name, in.Key, lease(in.Lease))
	for _, o := range in.Owners {
		fmt.Fprintf(w, "  %s  holds %d\n", o.Field, o.Holds)
	}
	fmt.Fprintf(w, "published an unlock on %s; its waiters try again\n", in.Channels[0].Name)
	if len(in.Queue) > 0 {
		fmt.Fprintf(w, "%d fair waiter(s) are woken by their own timeout at the latest\n", in.QueueLen)
	}
	return nil
}

// printInspection writes in as text, readable in 80 columns.
func printInspection(w io.Writer, in *lock.Inspection) {
	fmt.Fprintf(w, "lock %s", in.Name)
	if in.Key != in.Name {
		fmt.Fprintf(w, " (key %s)", in.Key)
	}
	fmt.Fprintln(w)
	if !in.Held() {
		fmt.Fprintln(w, "  free")
	} else {
		kind := string(in.Kind)
		if in.Mode != "" {
			kind += ", " + in.Mode + " mode"
		}
		fmt.Fprintf(w, "  held (%s), lease %s\n", kind, lease(in.Lease))
		for _, o := range in.Owners {
			line := fmt.Sprintf("    %s  holds %d", o.Field, o.Holds)
			if o.Lease != 0 {
				line += ", own lease " + lease(o.Lease)
			}
			fmt.Fprintln(w, line)
		}
	}
	switch {
	case in.Kind == lock.KindSemaphore:
		fmt.Fprintf(w, "  permits: %d free of %d\n", in.Free, in.Free+int64(len(in.Owners)))
	case in.Token == 0:
		fmt.Fprintln(w, "  fencing counter: none")
	case in.TokenTTL < 0:
		fmt.Fprintf(w, "  fencing counter: %d (no expiry)\n", in.Token)
	default:
		fmt.Fprintf(w, "  fencing counter: %d (idle expiry in %s)\n", in.Token, in.TokenTTL.Round(time.Second))
	}
	printFairLine(w, in.Queue, in.QueueLen)
	printLine(w, "writers waiting", in.Writers, in.WritersLen)
	waiting := false
	for _, c := range in.Channels {
		if c.Subscribers > 0 {
			if !waiting {
				fmt.Fprintln(w, "  subscribed to its unlock channels (one per waiting client):")
				waiting = true
			}
			fmt.Fprintf(w, "    %s  %d\n", c.Name, c.Subscribers)
		}
	}
	if !waiting {
		fmt.Fprintln(w, "  nobody subscribed to its unlock channels")
	}
}

func printLine(w io.Writer, what string, line []lock.Waiter, total int64) {
	if total == 0 {
		return
	}
	fmt.Fprintf(w, "  %s: %d\n", what, total)
	for i, wt := range line {
		fmt.Fprintf(w, "    %d. %s  renews within %s\n", i+1, wt.Field, lease(wt.Expires))
	}
	if int64(len(line)) < total {
		fmt.Fprintf(w, "    ... and %d more\n", total-int64(len(line)))
	}
}

// printFairLine writes a FairMutex's line: each waiter's side (ours, or
// foreign: a Redisson client's) and its deadlines.
func printFairLine(w io.Writer, line []lock.Waiter, total int64) {
	if total == 0 {
		return
	}
	fmt.Fprintf(w, "  fair line: %d\n", total)
	for i, wt := range line {
		fmt.Fprintf(w, "    %d. %s  %s\n", i+1, wt.Field, wt.Side())
		if wt.Foreign {
			fmt.Fprintf(w, "       deadline %s\n", lease(wt.Deadline))
		} else {
			fmt.Fprintf(w, "       liveness %s, deadline %s\n", lease(wt.Expires), lease(wt.Deadline))
		}
	}
	if int64(len(line)) < total {
		fmt.Fprintf(w, "    ... and %d more\n", total-int64(len(line)))
	}
}

// printList writes one line per lock: name, kind, holders, lease, waiters.
func printList(w io.Writer, ins []*lock.Inspection, limit int) {
	if len(ins) == 0 {
		fmt.Fprintln(w, "no locks match")
		return
	}
	fmt.Fprintf(w, "%-36s %-9s %7s %12s %7s\n", "name", "kind", "holders", "lease", "waiting")
	for _, in := range ins {
		var waiting int64
		for _, c := range in.Channels {
			waiting += c.Subscribers
		}
		left := "no expiry"
		if in.Lease > 0 {
			left = in.Lease.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "%-36s %-9s %7d %12s %7d\n", clip(in.Name, 36), in.Kind, len(in.Owners), left, waiting)
	}
	fmt.Fprintln(w, "waiting: connections subscribed to its unlock channels, one per waiting client")
	if len(ins) == limit {
		fmt.Fprintf(w, "(the first %d; -limit shows more)\n", limit)
	}
}

// clip shortens s to n columns, marking the cut.
func clip(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// lease formats a remaining time: "none" for no expiry.
func lease(d time.Duration) string {
	switch {
	case d == -1: // lock.Inspection's "no expiry"
		return "none (no expiry)"
	case d < 0:
		return "overdue by " + (-d).Round(time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String() + " left"
}

// lockReport is an inspection for -json: durations in milliseconds.
type lockReport struct {
	Name       string          `json:"name"`
	Key        string          `json:"key"`
	Kind       string          `json:"kind"`
	Mode       string          `json:"mode,omitempty"`
	Held       bool            `json:"held"`
	LeaseMs    int64           `json:"lease_ms"` // -1: no expiry
	Owners     []ownerReport   `json:"owners"`
	Token      int64           `json:"token"`
	TokenTTLMs int64           `json:"token_ttl_ms"`           // -1: no expiry
	Free       *int64          `json:"free_permits,omitempty"` // a semaphore's
	Queue      []waiterReport  `json:"fair_line"`
	QueueLen   int64           `json:"fair_line_length"`
	Writers    []waiterReport  `json:"writers_waiting"`
	WritersLen int64           `json:"writers_waiting_length"`
	Channels   []channelReport `json:"channels"`
}

type ownerReport struct {
	Field    string `json:"field"`
	ClientID string `json:"client_id"`
	OwnerID  string `json:"owner_id"`
	Holds    int64  `json:"holds"`
	Write    bool   `json:"write,omitempty"`
	LeaseMs  int64  `json:"lease_ms,omitempty"`
}

type waiterReport struct {
	Field      string `json:"field"`
	ClientID   string `json:"client_id"`
	OwnerID    string `json:"owner_id"`
	ExpiresMs  int64  `json:"expires_ms"`
	Side       string `json:"side,omitempty"`        // fair line: "ours" or "foreign"
	DeadlineMs int64  `json:"deadline_ms,omitempty"` // fair line: time left to its deadline in Redisson's line
}

type channelReport struct {
	Name        string `json:"name"`
	Subscribers int64  `json:"subscribers"`
}

type unlockReport struct {
	Removed bool       `json:"removed"`
	Lock    lockReport `json:"lock"` // as it was before
}

func ms(d time.Duration) int64 {
	if d == -1 {
		return -1
	}
	return d.Milliseconds()
}

func report(in *lock.Inspection) lockReport {
	r := lockReport{
		Name: in.Name, Key: in.Key, Kind: string(in.Kind), Mode: in.Mode, Held: in.Held(), LeaseMs: ms(in.Lease),
		Owners: []ownerReport{}, Token: in.Token, TokenTTLMs: ms(in.TokenTTL), Queue: []waiterReport{}, QueueLen: in.QueueLen,
		Writers: []waiterReport{}, WritersLen: in.WritersLen, Channels: []channelReport{},
	}
	if r.Kind == "" {
		r.Kind = "none"
	}
	if in.Kind == lock.KindSemaphore {
		r.Free = &in.Free
	}
	for _, o := range in.Owners {
		r.Owners = append(r.Owners, ownerReport{o.Field, o.ClientID, o.OwnerID, o.Holds, o.Write, ms(o.Lease)})
	}
	for _, wt := range in.Queue {
		r.Queue = append(r.Queue, waiterReport{wt.Field, wt.ClientID, wt.OwnerID, ms(wt.Expires), wt.Side(), ms(wt.Deadline)})
	}
	for _, wt := range in.Writers {
		r.Writers = append(r.Writers, waiterReport{Field: wt.Field, ClientID: wt.ClientID, OwnerID: wt.OwnerID, ExpiresMs: ms(wt.Expires)})
	}
	for _, c := range in.Channels {
		r.Channels = append(r.Channels, channelReport{c.Name, c.Subscribers})
	}
	return r
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

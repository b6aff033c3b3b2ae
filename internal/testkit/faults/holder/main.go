// Command holder is a lock holder in a process of its own, for fault
// scenarios that freeze it with SIGSTOP the way a stop-the-world pause
// would. It reads commands on stdin, one per line,
//
//	lock KEY     take the lock KEY (lock.Mutex, watchdog-renewed)
//	read KEY     read the register KEY under the lock
//	write KEY    write back the value last read plus one, fenced by the lock's token
//	unlock KEY   leave the critical section and release the lock
//	exit         close the lock client and exit
//
// and reports every step as a JSON line on stdout (faults.HolderEvent),
// including, the moment it happens, the loss of a lock ("lost").
//
// Flags choose how much protection the writes get: -notice late writes with
// the lock's token but not its cancellation, as a holder whose loss notice
// comes too late would; -fence off writes through a model without the fence
// column, as an application without the database backstop would.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/seckillguard/seckillguard/fencing"
	"github.com/seckillguard/seckillguard/internal/testkit/faults"
	"github.com/seckillguard/seckillguard/internal/testkit/history"
	"github.com/seckillguard/seckillguard/lock"
)

func main() {
	addr := flag.String("redis", "", "redis-server address")
	dsn := flag.String("dsn", "", "MariaDB DSN of the registers")
	watchdog := flag.Duration("watchdog", time.Second, "lock watchdog timeout")
	notice := flag.String("notice", "on", "on: writes carry the lock's context; late: its token without its cancellation")
	fence := flag.String("fence", "on", "on: writes go through the fenced model; off: through a model without the fence column")
	flag.Parse()
	if *addr == "" || *dsn == "" || (*notice != "on" && *notice != "late") || (*fence != "on" && *fence != "off") {
		fmt.Fprintln(os.Stderr, "usage: holder -redis ADDR -dsn DSN [-watchdog 1s] [-notice on|late] [-fence on|off]")
		os.Exit(2)
	}
	db, err := faults.OpenDB(*dsn)
	if err != nil {
		fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		fatal(err)
	}
	h := &holder{
		out:   json.NewEncoder(os.Stdout),
		db:    db,
		locks: lock.New(rdb, lock.WithWatchdogTimeout(*watchdog), lock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))),
		late:  *notice == "late",
		fence: *fence == "on",
		held:  make(map[string]*held),
	}
	h.emit(faults.HolderEvent{Ev: "ready", At: now()})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		verb, key, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch verb {
		case "lock":
			h.lock(key)
		case "read":
			h.read(key)
		case "write":
			h.write(key)
		case "unlock":
			h.unlock(key)
		case "exit":
			h.locks.Close()
			_ = rdb.Close()
			return
		case "":
		default:
			h.emit(faults.HolderEvent{Ev: "error", Err: "unknown command " + verb})
		}
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "holder:", err)
	os.Exit(1)
}

// now reads the host's monotonic clock, which the test process reads too
// (history.Now), so that the two order events alike.
func now() int64 { return history.Now().UnixNano() }

type holder struct {
	mu  sync.Mutex // serialises output lines
	out *json.Encoder

	db    *gorm.DB
	locks *lock.Client
	late  bool
	fence bool
	held  map[string]*held // by key; only the command loop touches it
}

// held is one lock the holder holds.
type held struct {
	m      *lock.Mutex
	ctx    context.Context
	token  fencing.Token
	read   int64
	readAt int64
}

func (h *holder) emit(e faults.HolderEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.out.Encode(e)
}

func (h *holder) lock(key string) {
	m := h.locks.Mutex(key)
	ctx, err := m.Lock(context.Background())
	if err != nil {
		h.emit(faults.HolderEvent{Ev: "error", Key: key, Err: err.Error()})
		return
	}
	tok, _ := fencing.FromContext(ctx)
	h.held[key] = &held{m: m, ctx: ctx, token: tok}
	h.emit(faults.HolderEvent{Ev: "locked", Key: key, Token: int64(tok), At: now()})
	context.AfterFunc(ctx, func() {
		if cause := context.Cause(ctx); errors.Is(cause, lock.ErrLost) {
			h.emit(faults.HolderEvent{Ev: "lost", Key: key, Token: int64(tok), At: now(), Cause: cause.Error()})
		}
	})
}

// workContext is the context reads and writes of x run with.
func (h *holder) workContext(x *held) context.Context {
	if h.late {
		return context.WithoutCancel(x.ctx)
	}
	return x.ctx
}

func (h *holder) read(key string) {
	x := h.held[key]
	if x == nil {
		h.emit(faults.HolderEvent{Ev: "error", Key: key, Err: "read without the lock"})
		return
	}
	start := now()
	v, err := faults.ReadRegister(h.workContext(x), h.db, key)
	if err != nil {
		h.emit(faults.HolderEvent{Ev: "error", Key: key, Err: err.Error()})
		return
	}
	x.read, x.readAt = v, start
	h.emit(faults.HolderEvent{Ev: "read", Key: key, Token: int64(x.token), Value: v, At: start})
}

func (h *holder) write(key string) {
	x := h.held[key]
	if x == nil {
		h.emit(faults.HolderEvent{Ev: "error", Key: key, Err: "write without the lock"})
		return
	}
	e := faults.HolderEvent{Ev: "write", Key: key, Token: int64(x.token), Read: x.read, ReadAt: x.readAt, Value: x.read + 1, Start: now()}
	err := faults.WriteRegister(h.workContext(x), h.db, key, x.read+1, h.fence)
	e.End = now()
	e.Accepted = err == nil
	e.Stale = errors.Is(err, fencing.ErrStale)
	var se *fencing.StaleError
	if errors.As(err, &se) {
		e.Current = int64(se.Current)
	}
	if err != nil {
		e.Err = err.Error()
	}
	h.emit(e)
}

func (h *holder) unlock(key string) {
	x := h.held[key]
	if x == nil {
		h.emit(faults.HolderEvent{Ev: "error", Key: key, Err: "unlock without the lock"})
		return
	}
	delete(h.held, key)
	h.emit(faults.HolderEvent{Ev: "leave", Key: key, Token: int64(x.token), At: now(),
		Lost: errors.Is(context.Cause(x.ctx), lock.ErrLost)})
	e := faults.HolderEvent{Ev: "unlocked", Key: key, Token: int64(x.token), At: now()}
	if err := x.m.Unlock(x.ctx); err != nil {
		e.Err = err.Error()
		e.Lost = errors.Is(err, lock.ErrLost)
	}
	h.emit(e)
}

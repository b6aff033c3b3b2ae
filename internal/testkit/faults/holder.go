package faults

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/seckillguard/seckillguard/internal/testkit/history"
)

// HolderPackage is the import path of the holder command.
const HolderPackage = "github.com/seckillguard/seckillguard/internal/testkit/faults/holder"

// HolderEvent is one line the holder command writes: a step it took, or
// the loss of a lock. Times are nanoseconds of the host's monotonic clock
// (history.Now), which the test process reads too.
type HolderEvent struct {
	Ev    string `json:"ev"` // ready, locked, read, write, lost, leave, unlocked, error
	Key   string `json:"key,omitempty"`
	Token int64  `json:"token,omitempty"`
	At    int64  `json:"at,omitempty"`

	Value  int64 `json:"value,omitempty"`   // read: the value read; write: the value written
	Read   int64 `json:"read,omitempty"`    // write: the value the write was computed from
	ReadAt int64 `json:"read_at,omitempty"` // write: when that read was sent
	Start  int64 `json:"start,omitempty"`   // write: sent
	End    int64 `json:"end,omitempty"`     // write: outcome known

	Accepted bool   `json:"accepted,omitempty"` // write: applied by the database
	Stale    bool   `json:"stale,omitempty"`    // write: refused with fencing.ErrStale
	Current  int64  `json:"current,omitempty"`  // write: the newer token the database named
	Lost     bool   `json:"lost,omitempty"`     // leave: the context said lost; unlocked: Unlock said lost
	Cause    string `json:"cause,omitempty"`    // lost: the context's cause
	Err      string `json:"err,omitempty"`
}

// A Holder is a running holder command.
type Holder struct {
	*Process
	Owner string // how its holds and writes are named in a history
}

// HolderOptions are the holder command's flags beyond its servers.
type HolderOptions struct {
	Watchdog   time.Duration // lock watchdog timeout; default 1s
	LateNotice bool          // -notice late: writes keep the token but not the cancellation
	NoFence    bool          // -fence off: writes through a model without the fence column
}

// StartHolder runs the holder binary bin (see Build and HolderPackage)
// against the redis-server at redisAddr and the registers in the database
// dsn, and waits until it is ready.
func StartHolder(t testing.TB, bin, owner, redisAddr, dsn string, o HolderOptions) *Holder {
	t.Helper()
	if o.Watchdog == 0 {
		o.Watchdog = time.Second
	}
	args := []string{"-redis", redisAddr, "-dsn", dsn, "-watchdog", o.Watchdog.String()}
	if o.LateNotice {
		args = append(args, "-notice", "late")
	}
	if o.NoFence {
		args = append(args, "-fence", "off")
	}
	h := &Holder{Process: Start(t, bin, args...), Owner: owner}
	h.Await(20*time.Second, "ready", func(l []byte) bool { return Event[HolderEvent](t, l).Ev == "ready" })
	return h
}

// do sends verb key and waits up to d for the event want about key.
func (h *Holder) do(verb, key, want string, d time.Duration) HolderEvent {
	h.t.Helper()
	from := h.Len()
	h.Send("%s %s", verb, key)
	line, _ := h.AwaitFrom(from, d, want+" "+key, func(l []byte) bool {
		e := Event[HolderEvent](h.t, l)
		return e.Key == key && (e.Ev == want || e.Ev == "error")
	})
	e := Event[HolderEvent](h.t, line)
	if e.Ev == "error" {
		h.t.Fatalf("faults: holder %s: %s %s: %s%s", h.Owner, verb, key, e.Err, h.tail())
	}
	return e
}

// Lock takes the lock key and returns the "locked" event.
func (h *Holder) Lock(key string, d time.Duration) HolderEvent { return h.do("lock", key, "locked", d) }

// Read reads register key under its lock.
func (h *Holder) Read(key string) HolderEvent { return h.do("read", key, "read", 10*time.Second) }

// Write writes back the value last read plus one and returns the outcome.
func (h *Holder) Write(key string) HolderEvent { return h.do("write", key, "write", 10*time.Second) }

// Unlock leaves the critical section and returns the "unlocked" event.
func (h *Holder) Unlock(key string) HolderEvent {
	return h.do("unlock", key, "unlocked", 10*time.Second)
}

// AwaitLost waits up to d for the holder to report that it lost lock key.
func (h *Holder) AwaitLost(key string, d time.Duration) HolderEvent {
	h.t.Helper()
	return Event[HolderEvent](h.t, h.Await(d, "loss of "+key, func(l []byte) bool {
		e := Event[HolderEvent](h.t, l)
		return e.Ev == "lost" && e.Key == key
	}))
}

// Record adds the holder's holds and writes so far to rec. A hold the
// holder has not left is recorded as never left.
func (h *Holder) Record(rec *history.Recorder) {
	h.t.Helper()
	open := make(map[string]*history.Hold)
	var order []*history.Hold
	for _, l := range h.Lines() {
		var e HolderEvent
		if err := json.Unmarshal(l, &e); err != nil {
			h.t.Fatalf("faults: holder %s wrote %q: %v", h.Owner, l, err)
		}
		switch e.Ev {
		case "locked":
			x := &history.Hold{Key: e.Key, Owner: h.Owner, Token: e.Token, Enter: unixNano(e.At)}
			open[e.Key] = x
			order = append(order, x)
		case "lost":
			if x := open[e.Key]; x != nil && x.Token == e.Token && x.LostAt.IsZero() {
				x.LostAt = unixNano(e.At)
			}
		case "leave":
			if x := open[e.Key]; x != nil {
				x.Leave = unixNano(e.At)
				if e.Lost && (x.LostAt.IsZero() || x.LostAt.After(x.Leave)) {
					x.LostAt = x.Leave // it knew by then
				}
				delete(open, e.Key)
			}
		case "write":
			rec.AddWrite(history.Write{
				Key: e.Key, Owner: h.Owner, Token: e.Token,
				Read: e.Read, ReadAt: unixNano(e.ReadAt), Value: e.Value,
				Start: unixNano(e.Start), End: unixNano(e.End),
				Accepted: e.Accepted, Err: e.Err,
			})
		}
	}
	for _, x := range order {
		rec.AddHold(*x)
	}
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

package redissonemu

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// A HoldLog records the holds of a contention run, from both sides, on one
// clock, and reports what a fair and safe run must show.
type HoldLog struct {
	mu    sync.Mutex
	holds []Hold
}

// A Hold is one acquisition: asked at Asked, held from Got until Freed
// (Freed is taken before the release is sent, Got after the grant came
// back, so [Got, Freed] lies inside the time the lock was really held).
type Hold struct {
	Worker string // "go#0", "java#1": the side before '#'
	Write  bool   // exclusive (false for a read hold or a permit)
	Asked  time.Time
	Got    time.Time
	Freed  time.Time
}

// Add records a hold.
func (l *HoldLog) Add(h Hold) {
	l.mu.Lock()
	l.holds = append(l.holds, h)
	l.mu.Unlock()
}

// Report is what Check finds.
type Report struct {
	Holds       int
	Overlaps    int            // holds that began while a conflicting one was held
	MostAtOnce  int            // holders at one moment
	Share       map[string]int // holds per worker
	LongestWait map[string]time.Duration
	// LongestIdle is the longest stretch with fewer holders than capacity
	// (nobody at all for locks) while someone waited.
	LongestIdle time.Duration
}

// Check reports on the holds; capacity is the number of permits (1 for a
// lock; reads share a lock with each other, not with a write).
func (l *HoldLog) Check(capacity int, shared bool) Report {
	l.mu.Lock()
	hs := append([]Hold(nil), l.holds...)
	l.mu.Unlock()
	sort.Slice(hs, func(i, j int) bool { return hs[i].Got.Before(hs[j].Got) })
	r := Report{Holds: len(hs), Share: map[string]int{}, LongestWait: map[string]time.Duration{}}
	var active []Hold
	for _, h := range hs {
		kept := active[:0]
		for _, a := range active {
			if a.Freed.After(h.Got) {
				kept = append(kept, a)
			}
		}
		active = kept
		conflict := false
		switch {
		case capacity > 1:
			conflict = len(active)+1 > capacity
		case shared:
			for _, a := range active {
				conflict = conflict || a.Write || h.Write
			}
		default:
			conflict = len(active) > 0
		}
		if conflict {
			r.Overlaps++
		}
		active = append(active, h)
		r.MostAtOnce = max(r.MostAtOnce, len(active))
		r.Share[h.Worker]++
		side := h.Worker
		for i := range side {
			if side[i] == '#' {
				side = side[:i]
				break
			}
		}
		r.LongestWait[side] = max(r.LongestWait[side], h.Got.Sub(h.Asked))
	}
	type event struct {
		at           time.Time
		dHeld, dWait int
	}
	var ev []event
	for _, h := range hs {
		ev = append(ev, event{h.Got, 1, 0}, event{h.Freed, -1, 0}, event{h.Asked, 0, 1}, event{h.Got, 0, -1})
	}
	sort.SliceStable(ev, func(i, j int) bool {
		if !ev[i].at.Equal(ev[j].at) {
			return ev[i].at.Before(ev[j].at)
		}
		return ev[i].dHeld+ev[i].dWait > ev[j].dHeld+ev[j].dWait
	})
	held, waiting := 0, 0
	var since time.Time
	for _, e := range ev {
		held += e.dHeld
		waiting += e.dWait
		if held < capacity && waiting > 0 {
			if since.IsZero() {
				since = e.at
			}
			continue
		}
		if !since.IsZero() {
			r.LongestIdle = max(r.LongestIdle, e.at.Sub(since))
			since = time.Time{}
		}
	}
	return r
}

// MinShare is the smallest share of holds (0..1) any worker got.
func (r Report) MinShare() (string, float64) {
	worst, least := "", 2.0
	for w, n := range r.Share {
		if f := float64(n) / float64(r.Holds); f < least {
			worst, least = w, f
		}
	}
	return worst, least
}

func (r Report) String() string {
	return fmt.Sprintf("%d holds, %d overlaps, at most %d at once, shares %v, longest waits %v, longest idle while someone waited %v",
		r.Holds, r.Overlaps, r.MostAtOnce, r.Share, r.LongestWait, r.LongestIdle)
}

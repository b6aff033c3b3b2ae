package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Kind names a class of anomaly.
type Kind string

// The anomalies Check reports.
const (
	// Overlap: a hold was entered while another hold of the key was in its
	// critical section, and that other holder was not told it had lost the
	// lock before it left.
	Overlap Kind = "overlap"
	// TokenOrder: a hold entered after another carries a token that is not
	// greater.
	TokenOrder Kind = "token-order"
	// WriteAfterLoss: a write sent after its hold was announced lost was
	// accepted.
	WriteAfterLoss Kind = "write-after-loss"
	// OvertakenWrite: a write was accepted after a write with a newer token
	// had been accepted.
	OvertakenWrite Kind = "overtaken-write"
	// LostUpdate: an accepted write read a value other than the one the
	// previous accepted write (in token order) wrote.
	LostUpdate Kind = "lost-update"
	// NotLinearizable: the accepted read-modify-writes admit no order that
	// respects real time in which each read sees the previous write.
	NotLinearizable Kind = "not-linearizable"
	// FinalState: the resource's final value is not the last accepted write's.
	FinalState Kind = "final-state"
	// LateNotice: a holder was told of its loss more than the tolerance
	// (NoticeWithin) after another hold of the key had entered.
	LateNotice Kind = "late-notice"
	// WriteWithoutHold: an accepted write whose owner held no lock with its
	// token, or that was sent after that hold had left.
	WriteWithoutHold Kind = "write-without-hold"
	// RefusedApplied: a write reported refused whose effect is visible
	// afterwards — the resource's final fence is its token and its final
	// value the write's, and no accepted write carried that token.
	RefusedApplied Kind = "refused-applied"
)

// DefaultNoticeTolerance is how late, after another hold of the key entered,
// a holder may be told of its loss before Check reports LateNotice, unless
// NoticeWithin says otherwise. A scenario that freezes a holder for longer
// sets its own.
const DefaultNoticeTolerance = time.Second

// An Option tunes Check.
type Option func(*config)

type config struct {
	notice time.Duration
	fences map[string]int64
}

// NoticeWithin sets the LateNotice tolerance; default DefaultNoticeTolerance.
func NoticeWithin(d time.Duration) Option { return func(c *config) { c.notice = d } }

// Fences gives the resource's final fence (the token that wrote it last)
// per key, for the RefusedApplied check; without it that check is left out.
func Fences(final map[string]int64) Option { return func(c *config) { c.fences = final } }

// An Anomaly is one violation of a guarantee.
type Anomaly struct {
	Kind   Kind
	Key    string
	Detail string
}

func (a Anomaly) String() string { return fmt.Sprintf("%s on %q: %s", a.Kind, a.Key, a.Detail) }

// A Report is the outcome of Check.
type Report struct {
	Anomalies []Anomaly
	Summary   Summary
	// Unprotected is the longest time a holder went on in its critical
	// section, not yet told of its loss, after another hold of the key had
	// entered (until it was told, however long the other hold lasted): the
	// window that only the fence covers. Zero when no holds overlapped.
	Unprotected time.Duration
	// LinearizabilityUnknown is set when porcupine ran out of time.
	LinearizabilityUnknown bool

	notice time.Duration
}

// OK reports whether no anomaly was found.
func (r Report) OK() bool { return len(r.Anomalies) == 0 }

// Has reports whether an anomaly of kind k was found.
func (r Report) Has(k Kind) bool {
	for _, a := range r.Anomalies {
		if a.Kind == k {
			return true
		}
	}
	return false
}

// String lists the anomalies, at most ten of each kind, after the summary.
func (r Report) String() string {
	var b strings.Builder
	s := r.Summary
	fmt.Fprintf(&b, "%d holds (%d announced lost), %d writes (%d accepted, %d rejected, %d of them from lost holds)",
		s.Holds, s.LostHolds, s.Writes, s.Accepted, s.Rejected, s.RejectedOfLost)
	if r.Unprotected > 0 {
		fmt.Fprintf(&b, "; a holder told of its loss up to %v after another entered", r.Unprotected)
	}
	per := make(map[Kind]int)
	for _, a := range r.Anomalies {
		per[a.Kind]++
		if per[a.Kind] <= 10 {
			b.WriteString("\n  ")
			b.WriteString(a.String())
		}
	}
	for k, n := range per {
		if n > 10 {
			fmt.Fprintf(&b, "\n  ... and %d more %s", n-10, k)
		}
	}
	return b.String()
}

// Check checks h against the guarantees listed in the package
// documentation. final holds the resource's value per key after the run;
// with a nil final the final-state check is left out.
func Check(h History, final map[string]int64, opts ...Option) Report {
	cfg := config{notice: DefaultNoticeTolerance}
	for _, o := range opts {
		o(&cfg)
	}
	r := Report{Summary: h.Summarize(), notice: cfg.notice}
	holds := make(map[string][]Hold)
	for _, x := range h.Holds {
		holds[x.Key] = append(holds[x.Key], x)
	}
	writes := make(map[string][]Write)
	for _, w := range h.Writes {
		writes[w.Key] = append(writes[w.Key], w)
	}
	for _, key := range h.Keys() {
		r.checkHolds(key, holds[key])
		r.checkWrites(key, holds[key], writes[key])
		last := r.checkChain(key, h.Initial[key], writes[key])
		if final != nil {
			if got, ok := final[key]; !ok || got != last {
				r.add(FinalState, key, "the database holds %d (present %v), the replay of the accepted writes gives %d", got, ok, last)
			}
		}
		if fence, ok := cfg.fences[key]; ok && final != nil {
			r.checkRefused(key, writes[key], final[key], fence)
		}
	}
	bad, unknown := linearizable(h.Writes, h.Initial)
	r.LinearizabilityUnknown = unknown
	for _, key := range bad {
		r.add(NotLinearizable, key, "no order of the accepted read-modify-writes that respects real time explains the values read")
	}
	return r
}

func (r *Report) add(k Kind, key, format string, args ...any) {
	r.Anomalies = append(r.Anomalies, Anomaly{Kind: k, Key: key, Detail: fmt.Sprintf(format, args...)})
}

// checkHolds checks exclusion and token order among the holds of one key.
func (r *Report) checkHolds(key string, hs []Hold) {
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Enter.Before(hs[j].Enter) })
	for i := range hs {
		a := hs[i]
		if i+1 < len(hs) && hs[i+1].Token <= a.Token {
			b := hs[i+1]
			r.add(TokenOrder, key, "%s entered at %s with token %d after %s entered with token %d",
				b.Owner, stamp(b.Enter), b.Token, a.Owner, a.Token)
		}
		for j := i + 1; j < len(hs) && hs[j].Enter.Before(a.end()); j++ {
			b := hs[j]
			if !a.Lost() {
				r.add(Overlap, key, "%s (token %d) entered at %s while %s (token %d, entered %s) was inside until %s and was not told it lost the lock",
					b.Owner, b.Token, stamp(b.Enter), a.Owner, a.Token, stamp(a.Enter), stamp(a.Leave))
				continue
			}
			// Announced, but only the fence covered the time until then,
			// however soon b left: a went on believing it held the lock.
			if late := a.LostAt.Sub(b.Enter); late > 0 {
				r.Unprotected = max(r.Unprotected, late)
				if late > r.notice {
					r.add(LateNotice, key, "%s (token %d) was told at %s that it lost the lock, %v after %s (token %d) entered at %s; tolerance %v",
						a.Owner, a.Token, stamp(a.LostAt), late, b.Owner, b.Token, stamp(b.Enter), r.notice)
				}
			}
		}
	}
}

// checkWrites checks that the fence refused what it must.
func (r *Report) checkWrites(key string, hs []Hold, ws []Write) {
	lostAt := make(map[holdRef]time.Time)
	for _, x := range hs {
		if !x.LostAt.IsZero() {
			lostAt[holdRef{x.Key, x.Owner, x.Token}] = x.LostAt
		}
	}
	held := make(map[holdRef]Hold)
	for _, x := range hs {
		held[holdRef{x.Key, x.Owner, x.Token}] = x
	}
	var accepted []Write
	for _, w := range ws {
		if !w.Accepted {
			continue
		}
		accepted = append(accepted, w)
		switch x, ok := held[holdRef{w.Key, w.Owner, w.Token}]; {
		case !ok:
			r.add(WriteWithoutHold, key, "%s's write with token %d, sent at %s, was accepted, and %s held no lock with that token",
				w.Owner, w.Token, stamp(w.Start), w.Owner)
		case w.Start.After(x.end()):
			r.add(WriteWithoutHold, key, "%s's write with token %d, sent at %s, was accepted after its hold had left at %s",
				w.Owner, w.Token, stamp(w.Start), stamp(x.Leave))
		}
		if at, ok := lostAt[holdRef{w.Key, w.Owner, w.Token}]; ok && !w.Start.Before(at) {
			r.add(WriteAfterLoss, key, "%s (token %d) was told at %s that it lost the lock, and its write sent at %s was accepted",
				w.Owner, w.Token, stamp(at), stamp(w.Start))
		}
	}
	// A write accepted once a newer token's write had been accepted.
	byEnd := append([]Write(nil), accepted...)
	sort.Slice(byEnd, func(i, j int) bool { return byEnd[i].End.Before(byEnd[j].End) })
	byStart := append([]Write(nil), accepted...)
	sort.Slice(byStart, func(i, j int) bool { return byStart[i].Start.Before(byStart[j].Start) })
	var newest Write
	k := 0
	for _, w := range byStart {
		for ; k < len(byEnd) && byEnd[k].End.Before(w.Start); k++ {
			if byEnd[k].Token > newest.Token {
				newest = byEnd[k]
			}
		}
		if newest.Token > w.Token {
			r.add(OvertakenWrite, key, "%s's write with token %d, sent at %s, was accepted after %s's write with token %d had been (at %s)",
				w.Owner, w.Token, stamp(w.Start), newest.Owner, newest.Token, stamp(newest.End))
		}
	}
}

// checkRefused reports the refused writes whose effect the resource shows:
// its final fence is their token and its final value theirs, which no
// accepted write explains.
func (r *Report) checkRefused(key string, ws []Write, value, fence int64) {
	for _, w := range ws {
		if w.Accepted || w.Token != fence || w.Value != value {
			continue
		}
		explained := false
		for _, o := range ws {
			if o.Accepted && o.Token == w.Token {
				explained = true
				break
			}
		}
		if !explained {
			r.add(RefusedApplied, key, "%s's write of %d with token %d was reported refused (%s), and the resource holds %d written by token %d",
				w.Owner, w.Value, w.Token, w.Err, value, fence)
		}
	}
}

// checkChain replays the accepted writes of one key in token order, checks
// that each read the previous one's value, and returns the last value.
func (r *Report) checkChain(key string, initial int64, ws []Write) int64 {
	var chain []Write
	for _, w := range ws {
		if w.Accepted {
			chain = append(chain, w)
		}
	}
	sort.SliceStable(chain, func(i, j int) bool {
		if chain[i].Token != chain[j].Token {
			return chain[i].Token < chain[j].Token
		}
		return chain[i].Start.Before(chain[j].Start)
	})
	v, by := initial, "the initial value"
	for _, w := range chain {
		if w.Read != v {
			r.add(LostUpdate, key, "%s (token %d) read %d and wrote %d, but %s had left %d",
				w.Owner, w.Token, w.Read, w.Value, by, v)
		}
		v, by = w.Value, fmt.Sprintf("%s (token %d)", w.Owner, w.Token)
	}
	return v
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Format("15:04:05.000000")
}

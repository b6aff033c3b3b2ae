package history

import (
	"strings"
	"testing"
	"time"
)

// at returns a time ms milliseconds into a run.
func at(ms int) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(ms) * time.Millisecond)
}

// hold is a critical section of key "k" from enter to leave (ms).
func hold(owner string, token int64, enter, leave int) Hold {
	return Hold{Key: "k", Owner: owner, Token: token, Enter: at(enter), Leave: at(leave)}
}

// write is a write under hold h that read read at readAt and wrote read+1
// from start to end.
func write(h Hold, read int64, readAt, start, end int, accepted bool) Write {
	w := Write{Key: h.Key, Owner: h.Owner, Token: h.Token, Read: read, ReadAt: at(readAt), Value: read + 1,
		Start: at(start), End: at(end), Accepted: accepted}
	if !accepted {
		w.Err = "fencing: stale token"
	}
	return w
}

// sequential is a clean history: three holders one after another, each
// incrementing the register once.
func sequential() History {
	a, b, c := hold("a", 10, 0, 10), hold("b", 11, 11, 20), hold("c", 15, 21, 30)
	return History{
		Holds:   []Hold{c, a, b}, // the order of recording does not matter
		Writes:  []Write{write(a, 0, 1, 2, 3, true), write(b, 1, 12, 13, 14, true), write(c, 2, 22, 23, 24, true)},
		Initial: map[string]int64{"k": 0},
	}
}

func wantOnly(t *testing.T, r Report, kinds ...Kind) {
	t.Helper()
	want := make(map[Kind]bool)
	for _, k := range kinds {
		want[k] = true
		if !r.Has(k) {
			t.Errorf("no %s reported:\n%s", k, r)
		}
	}
	for _, a := range r.Anomalies {
		if !want[a.Kind] {
			t.Errorf("unexpected %s:\n%s", a.Kind, r)
		}
	}
}

func TestCheck_SequentialHistoryIsClean(t *testing.T) {
	r := Check(sequential(), map[string]int64{"k": 3})
	if !r.OK() || r.LinearizabilityUnknown || r.Unprotected != 0 {
		t.Fatalf("clean history reported:\n%s", r)
	}
	if s := r.Summary; s.Holds != 3 || s.Accepted != 3 || s.Rejected != 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestCheck_OverlapOfHoldsNeverToldIsReported(t *testing.T) {
	h := sequential()
	h.Holds[1].Leave = at(15) // a is still inside when b enters at 11
	wantOnly(t, Check(h, map[string]int64{"k": 3}), Overlap)
}

func TestCheck_OverlapOfAnAnnouncedLossIsAllowedAndMeasured(t *testing.T) {
	h := sequential()
	h.Holds[1].Leave, h.Holds[1].LostAt = at(15), at(13) // told at 13, two ms after b entered
	r := Check(h, map[string]int64{"k": 3})
	if !r.OK() {
		t.Fatalf("announced loss reported:\n%s", r)
	}
	if r.Unprotected != 2*time.Millisecond {
		t.Fatalf("unprotected window %v, want 2ms", r.Unprotected)
	}
}

func TestCheck_LossAnnouncedOnlyAfterLeavingIsAnOverlap(t *testing.T) {
	h := sequential()
	h.Holds[1].Leave, h.Holds[1].LostAt = at(15), at(16)
	wantOnly(t, Check(h, map[string]int64{"k": 3}), Overlap)
}

func TestCheck_HolderThatNeverLeftOverlapsEveryLaterHold(t *testing.T) {
	h := sequential()
	h.Holds[1].Leave = time.Time{} // a was killed inside
	wantOnly(t, Check(h, map[string]int64{"k": 3}), Overlap)
	h.Holds[1].LostAt = at(5)
	if r := Check(h, map[string]int64{"k": 3}); !r.OK() {
		t.Fatalf("killed holder told of its loss:\n%s", r)
	}
}

func TestCheck_TokensMustIncreaseInEntryOrder(t *testing.T) {
	h := sequential()
	h.Holds[0].Token = 11 // c gets b's token
	h.Writes[2].Token = 11
	wantOnly(t, Check(h, map[string]int64{"k": 3}), TokenOrder)
}

func TestCheck_WriteSentAfterTheLossWasAnnouncedMustBeRejected(t *testing.T) {
	a := hold("a", 10, 0, 10)
	a.LostAt = at(5)
	h := History{Holds: []Hold{a}, Writes: []Write{write(a, 0, 1, 6, 7, true)}}
	wantOnly(t, Check(h, map[string]int64{"k": 1}), WriteAfterLoss)
	h.Writes[0] = write(a, 0, 1, 6, 7, false)
	if r := Check(h, map[string]int64{"k": 0}); !r.OK() || r.Summary.RejectedOfLost != 1 {
		t.Fatalf("rejected write of a lost hold:\n%s", r)
	}
}

// paused is a holder paused past its lease (a GC pause): a reads 0 and stops; its lock expires; b
// enters with a newer token, reads 0 and writes 1; a wakes and writes 1.
func paused(lateAccepted bool) History {
	a, b := hold("a", 10, 0, 40), hold("b", 20, 10, 20)
	a.LostAt = at(35) // told by its watchdog after it woke, after its write went out
	return History{
		Holds:   []Hold{a, b},
		Writes:  []Write{write(a, 0, 1, 30, 31, lateAccepted), write(b, 0, 11, 12, 13, true)},
		Initial: map[string]int64{"k": 0},
	}
}

func TestCheck_FencedPauseIsClean(t *testing.T) {
	r := Check(paused(false), map[string]int64{"k": 1})
	if !r.OK() {
		t.Fatalf("fenced pause reported:\n%s", r)
	}
	if r.Unprotected != 25*time.Millisecond {
		t.Fatalf("unprotected %v, want 25ms: from b's entry until a was told, although b left after 10ms", r.Unprotected)
	}
}

func TestCheck_UnfencedPauseIsALostUpdate(t *testing.T) {
	r := Check(paused(true), map[string]int64{"k": 1})
	wantOnly(t, r, OvertakenWrite, LostUpdate, NotLinearizable)
	if !strings.Contains(r.String(), `lost-update on "k": a (token 10) read 0 and wrote 1`) &&
		!strings.Contains(r.String(), `lost-update on "k": b (token 20) read 0 and wrote 1`) {
		t.Fatalf("report does not explain the lost update:\n%s", r)
	}
}

func TestCheck_FinalStateMustBeTheReplay(t *testing.T) {
	wantOnly(t, Check(sequential(), map[string]int64{"k": 2}), FinalState)
	wantOnly(t, Check(sequential(), map[string]int64{}), FinalState)
	if r := Check(sequential(), nil); !r.OK() {
		t.Fatalf("no final state given:\n%s", r)
	}
}

func TestCheck_ConcurrentAcceptedIncrementsAreNotLinearizable(t *testing.T) {
	// Two writes accepted with increasing tokens whose read windows overlap
	// but which both read 0: no lock was involved at all.
	a, b := hold("a", 10, 0, 10), hold("b", 11, 0, 10)
	h := History{Writes: []Write{write(a, 0, 1, 2, 3, true), write(b, 0, 1, 4, 5, true)}}
	wantOnly(t, Check(h, nil), LostUpdate, NotLinearizable, WriteWithoutHold)
}

func TestCheck_LateNoticeIsReportedHoweverSoonTheOtherLeft(t *testing.T) {
	// a is frozen inside; b enters at 10 and leaves at 30; a is told only
	// five seconds after b entered.
	a, b := hold("a", 10, 0, 6000), hold("b", 20, 10, 30)
	a.LostAt = at(5010)
	h := History{Holds: []Hold{a, b}}
	r := Check(h, nil)
	wantOnly(t, r, LateNotice)
	if r.Unprotected != 5*time.Second {
		t.Fatalf("unprotected %v, want 5s (a was told 5s after b entered), not b's 20ms hold", r.Unprotected)
	}
	if !strings.Contains(r.String(), "5s after b (token 20) entered") {
		t.Errorf("report does not say how late:\n%s", r)
	}
	// Within a tolerance the scenario sets (a pause it caused itself).
	if r := Check(h, nil, NoticeWithin(6*time.Second)); !r.OK() {
		t.Fatalf("notice within the tolerance reported:\n%s", r)
	}
	// Told 20ms after b entered: within the default.
	h.Holds[0].LostAt = at(30)
	if r := Check(h, nil); !r.OK() || r.Unprotected != 20*time.Millisecond {
		t.Fatalf("prompt notice reported (unprotected %v):\n%s", r.Unprotected, r)
	}
}

func TestCheck_AcceptedWriteWithoutAHoldIsReported(t *testing.T) {
	h := sequential()
	ghost := hold("ghost", 16, 0, 0)
	h.Writes = append(h.Writes, write(ghost, 3, 31, 32, 33, true)) // nobody recorded a hold of "ghost"
	wantOnly(t, Check(h, map[string]int64{"k": 4}), WriteWithoutHold)

	// A write under a real owner but another token is no better.
	h = sequential()
	h.Writes[1].Token = 99
	r := Check(h, map[string]int64{"k": 3})
	if !r.Has(WriteWithoutHold) {
		t.Fatalf("write with a token its owner never held not reported:\n%s", r)
	}
}

func TestCheck_AcceptedWriteAfterItsHoldLeftIsReported(t *testing.T) {
	h := sequential()
	c := h.Holds[0] // leaves at 30
	h.Writes = append(h.Writes, write(c, 3, 31, 32, 33, true))
	r := Check(h, map[string]int64{"k": 4})
	wantOnly(t, r, WriteWithoutHold)
	if !strings.Contains(r.String(), "after its hold had left") {
		t.Fatalf("report does not say the hold had left:\n%s", r)
	}
	// The same write refused is fine.
	h.Writes[3] = write(c, 3, 31, 32, 33, false)
	if r := Check(h, map[string]int64{"k": 3}); !r.OK() {
		t.Fatalf("refused late write reported:\n%s", r)
	}
}

func TestCheck_RefusedWriteWhoseEffectIsVisibleIsReported(t *testing.T) {
	// b's write was reported refused (the error said stale), but the row
	// holds its value and token: it was applied.
	a, b := hold("a", 10, 0, 10), hold("b", 11, 11, 20)
	h := History{
		Holds:   []Hold{a, b},
		Writes:  []Write{write(a, 0, 1, 2, 3, true), write(b, 1, 12, 13, 14, false)},
		Initial: map[string]int64{"k": 0},
	}
	r := Check(h, map[string]int64{"k": 2}, Fences(map[string]int64{"k": 11}))
	wantOnly(t, r, RefusedApplied, FinalState)
	if !strings.Contains(r.String(), "b's write of 2 with token 11 was reported refused") {
		t.Errorf("report does not name the write:\n%s", r)
	}
	// The row shows a's write: b's refusal was true.
	if r := Check(h, map[string]int64{"k": 1}, Fences(map[string]int64{"k": 10})); !r.OK() {
		t.Fatalf("true refusal reported:\n%s", r)
	}
	// b claimed the row (fence 11) and its write was refused: the value
	// says the write did not land.
	if r := Check(h, map[string]int64{"k": 1}, Fences(map[string]int64{"k": 11})); !r.OK() {
		t.Fatalf("claimed row with a refused write reported:\n%s", r)
	}
}

func TestCheck_KeysAreCheckedApart(t *testing.T) {
	h := sequential()
	other := hold("z", 1, 0, 100)
	other.Key = "other"
	h.Holds = append(h.Holds, other) // overlaps every hold of "k", but on another key
	h.Writes = append(h.Writes, Write{Key: "other", Owner: "z", Token: 1, Read: 5, Value: 6, ReadAt: at(1), Start: at(2), End: at(3), Accepted: true})
	h.Initial["other"] = 5
	if r := Check(h, map[string]int64{"k": 3, "other": 6}); !r.OK() {
		t.Fatalf("keys mixed up:\n%s", r)
	}
}

func TestRecorder_CollectsFromManyGoroutines(t *testing.T) {
	r := NewRecorder()
	r.Initial("k", 7)
	done := make(chan struct{})
	for i := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			r.AddHold(hold("a", int64(i+1), i*10, i*10+5))
			r.AddWrite(write(hold("a", int64(i+1), i*10, i*10+5), int64(7+i), i*10+1, i*10+2, i*10+3, true))
		}()
	}
	for range 8 {
		<-done
	}
	h := r.History()
	if len(h.Holds) != 8 || len(h.Writes) != 8 || h.Initial["k"] != 7 {
		t.Fatalf("recorded %d holds, %d writes, initial %v", len(h.Holds), len(h.Writes), h.Initial)
	}
	if rep := Check(h, map[string]int64{"k": 15}); !rep.OK() {
		t.Fatalf("%s", rep)
	}
}

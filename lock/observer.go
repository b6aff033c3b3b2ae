package lock

import (
	"context"
	"time"

	"github.com/seckillguard/seckillguard/fencing"
)

// An EventType names what happened to a hold.
type EventType int

// The events a Client reports to its Observer.
const (
	// EventAcquired: a first acquisition (not a re-entry) succeeded; Wait
	// is how long the call took, waiting included.
	EventAcquired EventType = iota + 1
	// EventHandedOver: the holder's final Unlock handed the lock to a
	// waiter of the same Client without freeing it (the waiter reports its
	// own EventAcquired). When the waiter runs before the handover reaches
	// Redis and Redis then finds the lock gone, EventLost follows.
	EventHandedOver
	// EventRenewed: the watchdog renewed the hold's lease.
	EventRenewed
	// EventLost: the hold was found lost (expired, deleted, its renewals
	// failed); Cause says why, and its context is cancelled with it.
	EventLost
	// EventReleased: the hold ended without being lost: its final Unlock,
	// a handover, or the end of the context it was taken with.
	EventReleased
	// EventReleasedLater: a final Unlock failed and was completed by the
	// Client's retries in the background.
	EventReleasedLater
)

var eventNames = map[EventType]string{
	EventAcquired: "acquired", EventHandedOver: "handed_over", EventRenewed: "renewed",
	EventLost: "lost", EventReleased: "released", EventReleasedLater: "released_later",
}

// EventTypes returns every EventType, for observers that create their
// series up front. The slice is the caller's.
func EventTypes() []EventType {
	return []EventType{EventAcquired, EventHandedOver, EventRenewed, EventLost, EventReleased, EventReleasedLater}
}

// String returns the event's name: "acquired", "handed_over", "renewed",
// "lost", "released", "released_later".
func (t EventType) String() string { return eventNames[t] }

// Kinds returns the values of Event.Kind, the kinds Inspect reports for a
// lock that is held: KindMutex, KindRWMutex, KindSemaphore. The slice is the
// caller's.
func Kinds() []Kind {
	return []Kind{KindMutex, KindRWMutex, KindSemaphore}
}

// An Event is one thing that happened to a hold of a Client.
type Event struct {
	Type EventType
	// Kind is the lock's layout in Redis, one of Kinds, as Inspect names
	// it: KindMutex for a Mutex, a FairMutex, a MultiLock's or a RedLock's
	// lock, KindRWMutex for either side of an RWMutex (Mode says which),
	// KindSemaphore for a permit. A bounded label value.
	Kind Kind
	// Mode is "read" or "write" for an RWMutex hold, as Inspection.Mode;
	// "" for the other kinds.
	Mode string
	// Name is the lock's full Redis name, the Client's namespace included
	// (Client.Key): for logs and traces, never a metric label (names
	// derived from requests are unbounded).
	Name  string
	Token fencing.Token // the hold's fencing token (0 for kinds without one)
	Wait  time.Duration // EventAcquired: how long the acquisition took
	Held  time.Duration // since the acquisition (0 for EventAcquired)
	Cause error         // EventLost: why
	// Owner is the hold's owner field in Redis, as Inspect reports it: the
	// same in every event of one hold and another for any other hold, so
	// that an observer can pair a hold's acquisition with its end. Like
	// Name, it is for logs and traces, never a metric label.
	Owner string
	// Context is the context the hold was taken with (it may have ended):
	// it carries the caller's values, such as a trace's span and request
	// ids, for an observer that traces or logs. An Observer must not keep
	// it beyond the hold's end. Never nil.
	Context context.Context
}

// An Observer is told of every Event of a Client's holds, synchronously,
// in the order they happen for each hold. It must be fast and must not call
// the Client. The lock package itself records nothing: an Observer is the
// hook for metrics and tracing (package guard has a Prometheus one).
type Observer func(Event)

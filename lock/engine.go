package lock

// The package from the bottom up, in layers, each using only the layers
// before it but for one loop: a hold and its table reach up to the engine
// they belong to (hold.c), and the watchdog and a hold know each other.
//
//   - errors.go, names.go, replicas.go, inspection.go, observer.go,
//     options.go: errors, key names, and the vocabulary of the options, the
//     Observer and Inspect.
//   - link.go, cluster.go, scripts.go (and scripts/): what every part works
//     through: the go-redis client, options, script calls, background life.
//   - inflight.go, hold.go, holds.go, lifecycle.go, observe.go, watchdog.go:
//     a hold, the table of holds, the transitions of a hold's lifecycle,
//     what the Observer is told, and the renewals.
//   - pubsub.go, lines.go, queue.go, waiter.go, turns.go: the waiting lines.
//   - engine.go, attempt.go, wait.go, settle.go, handover.go, levels.go,
//     acquire.go, release.go: one acquisition and one release of a single
//     key.
//   - mutex.go, fair.go, rwmutex.go, semaphore.go: the single-key kinds.
//   - compound.go, multilock.go, multiacquire.go, multiunlock.go,
//     redlock.go, redvote.go, redwait.go, redacquire.go: the locks of
//     several keys.
//   - inspect.go, client.go: Inspect, and the Client over all of it.

// An engine is a Client's lock machinery: its link to Redis, its waiting
// lines, its hold table and its watchdog, each the sole owner of its state.
// The acquisition (acquire.go, levels.go, wait.go), the release
// (release.go, settle.go) and the handover (handover.go) go through it;
// every lock value reaches it through its Client.
type engine struct {
	*link
	*lines
	holds holdTable // every hold of the Client, by id
	dog   *watchdogLoop
}

// newEngine returns the engine of the Client behind l.
func newEngine(l *link) *engine {
	return &engine{link: l, lines: newLines(l), holds: newHoldTable(), dog: newWatchdog(l)}
}

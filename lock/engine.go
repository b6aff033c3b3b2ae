package lock

// An engine is a Client's lock machinery: its link to Redis, its waiting
// lines, its hold table and its watchdog, each the sole owner of its state.
// The acquisition (acquire.go, wait.go), the release (release.go) and the
// handover (handover.go) are its methods; every lock value reaches it
// through its Client.
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

package guard

// SetWaitingHook makes f learn, each time a request joins or leaves the
// line of a key on a combining route, how many requests wait in it; nil
// removes it.
func SetWaitingHook(f func(key string, n int)) {
	if f == nil {
		testHookWaiting.Store(nil)
		return
	}
	testHookWaiting.Store(&f)
}

package lock

// HoldsOf returns how many holds c keeps registered: held ones, and ones an
// operation in progress uses. The model test (model_test.go) requires 0
// once everything it took has been released.
func HoldsOf(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.holds)
}

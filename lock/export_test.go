package lock

import "fmt"

// HoldsOf returns how many holds c keeps registered: held ones, and ones an
// operation in progress uses. The model test (model_test.go) requires 0
// once everything it took has been released.
func HoldsOf(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.holds)
}

// DescribeHolds describes the holds c keeps registered, for a test's
// failure message.
func DescribeHolds(c *Client) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id, h := range c.holds {
		out = append(out, fmt.Sprintf("%s role %d owner %d: refs %d pinned %v lost %v kind %T",
			id.key, id.role, id.owner, h.refs, h.pinned, h.lost, h.kind))
	}
	return out
}

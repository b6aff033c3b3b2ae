package testenv

import (
	"context"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// CommandCounter is a go-redis hook that counts the commands a client sends
// (pipelined ones included), by lower-case command name. Redis' own INFO
// commandstats also counts the commands scripts run inside the server; this
// counts what crosses the network.
type CommandCounter struct {
	mu     sync.Mutex
	counts map[string]int64
	shas   map[string]int64 // EVALSHA calls by script SHA1
}

// NewCommandCounter returns a counter; add it with client.AddHook.
func NewCommandCounter() *CommandCounter {
	return &CommandCounter{counts: make(map[string]int64), shas: make(map[string]int64)}
}

// DialHook implements redis.Hook.
func (c *CommandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook implements redis.Hook.
func (c *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *CommandCounter) add(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	c.mu.Lock()
	c.counts[name]++
	if args := cmd.Args(); name == "evalsha" && len(args) > 1 {
		if sha, ok := args[1].(string); ok {
			c.shas[sha]++
		}
	}
	c.mu.Unlock()
}

// Script returns how many EVALSHA calls of the script with this SHA1 were
// counted so far, pipelined ones included.
func (c *CommandCounter) Script(sha string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shas[sha]
}

// Snapshot returns the counts so far.
func (c *CommandCounter) Snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// Total returns the number of commands counted so far.
func (c *CommandCounter) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.counts {
		n += v
	}
	return n
}

// String lists the counts by name.
func (c *CommandCounter) String() string {
	s := c.Snapshot()
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, k := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(s[k], 10))
	}
	return b.String()
}

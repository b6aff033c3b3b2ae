package lock

import (
	"context"
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

func loadScript(name string) *redis.Script {
	src, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic("lock: missing embedded script " + name)
	}
	return redis.NewScript(string(src))
}

var (
	acquireScript     = loadScript("acquire.lua")
	releaseScript     = loadScript("release.lua")
	renewScript       = loadScript("renew.lua")
	forceUnlockScript = loadScript("forceunlock.lua")
)

// run sends s with EVALSHA. A server that does not know the script (restarted,
// failed over, SCRIPT FLUSH) answers NOSCRIPT once; the script is then sent
// whole with EVAL, which caches it again.
func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return s.Run(ctx, c.rdb, keys, args...)
}

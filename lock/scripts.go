package lock

import (
	"context"
	"embed"
	"regexp"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// loadScript returns the embedded script name with the libraries libs in
// front of it, and in front of them lib.lua when they use it.
func loadScript(name string, libs ...string) *redis.Script {
	src := ""
	for _, f := range append(libs, name) {
		src += embeddedScript(f) + "\n"
	}
	if usesLib.MatchString(src) {
		src = embeddedScript("lib.lua") + "\n" + src
	}
	return redis.NewScript(src)
}

// usesLib matches a script that calls a helper of lib.lua or reads the
// server's clock (lib.lua makes that safe on every server). A script that
// does neither goes without lib.lua: Lua would build its helpers on every
// call for nothing.
var usesLib = regexp.MustCompile(`\b(now_us|now_ms|issue_token|raise_token)\s*\(|redis\.call\(\s*['"]time['"]`)

// embeddedScript returns the text of scripts/name.
func embeddedScript(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic("lock: missing embedded script " + name)
	}
	return string(b)
}

var (
	acquireScript     = loadScript("acquire.lua")
	releaseScript     = loadScript("release.lua")
	renewScript       = loadScript("renew.lua")
	forceUnlockScript = loadScript("forceunlock.lua")
	transferScript    = loadScript("transfer.lua")
	raiseTokenScript  = loadScript("raise_token.lua")
	waitingScript     = loadScript("waiting.lua")

	fairAcquireScript = loadScript("fair_acquire.lua", "fairlib.lua")
	fairReleaseScript = loadScript("fair_release.lua", "fairlib.lua")
	fairLeaveScript   = loadScript("fair_leave.lua", "fairlib.lua")

	readAcquireScript  = loadScript("read_acquire.lua", "rwlib.lua")
	readReleaseScript  = loadScript("read_release.lua", "rwlib.lua")
	readRenewScript    = loadScript("read_renew.lua")
	writeAcquireScript = loadScript("write_acquire.lua", "rwlib.lua")
	writeReleaseScript = loadScript("write_release.lua", "rwlib.lua")
	writeLeaveScript   = loadScript("write_leave.lua", "rwlib.lua")

	multiAcquireScript = loadScript("multi_acquire.lua")
	multiReleaseScript = loadScript("multi_release.lua")

	permitAcquireScript = loadScript("permit_acquire.lua")
	permitReleaseScript = loadScript("permit_release.lua")
	permitRenewScript   = loadScript("permit_renew.lua")
)

// run sends s with EVALSHA. A server that does not know the script (restarted,
// failed over, SCRIPT FLUSH) answers NOSCRIPT once; the script is then sent
// whole with EVAL, which caches it again.
func (c *Client) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return s.Run(ctx, c.rdb, keys, args...)
}

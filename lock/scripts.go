package lock

import (
	"context"
	"embed"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// loadScript returns the embedded script name assembled with the libraries
// libs: their text in front of the script's, in the order given, so that
// the script is still one EVALSHA. Each script below names every library it
// uses; nothing is added to it that it does not name (a library it does not
// call costs Lua the building of its helpers on every call). A library name
// that is not embedded panics when the package loads.
//
// Redis reports the line of a script error counting from the first line of
// the assembled text, libraries included: subtract their lengths to find the
// line in the script's own file.
func loadScript(name string, libs ...string) *script {
	src := ""
	for _, f := range append(libs, name) {
		src += embeddedScript(f) + "\n"
	}
	s := &script{Script: redis.NewScript(src), src: src}
	s.sha = s.Hash()
	return s
}

// A script is one of the package's Lua scripts, assembled (see loadScript).
type script struct {
	*redis.Script        // for pipelines (EvalSha) and SCRIPT LOAD
	src           string // the assembled text, for EVAL
	sha           any    // its SHA1 in hex, boxed once: an argument of every EVALSHA
}

// embeddedScript returns the text of scripts/name.
func embeddedScript(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic("lock: missing embedded script " + name)
	}
	return string(b)
}

// The scripts, each with the libraries it is assembled with. lib.lua (the
// clock, fencing tokens, the replication mode) comes first wherever it is
// used; fairlib.lua and rwlib.lua hold what the scripts of one kind share
// and use lib.lua's clock.
var (
	acquireScript     = loadScript("acquire.lua") // lib.lua inline: see the script
	releaseScript     = loadScript("release.lua")
	renewScript       = loadScript("renew.lua")
	forceUnlockScript = loadScript("forceunlock.lua")
	transferScript    = loadScript("transfer.lua", "lib.lua")
	raiseTokenScript  = loadScript("raise_token.lua", "lib.lua")
	waitingScript     = loadScript("waiting.lua", "lib.lua")

	fairAcquireScript = loadScript("fair_acquire.lua", "lib.lua", "fairlib.lua")
	fairReleaseScript = loadScript("fair_release.lua", "lib.lua", "fairlib.lua")
	fairLeaveScript   = loadScript("fair_leave.lua", "lib.lua", "fairlib.lua")
	fairAliveScript   = loadScript("fair_alive.lua", "lib.lua")

	readAcquireScript  = loadScript("read_acquire.lua", "lib.lua", "rwlib.lua")
	readReleaseScript  = loadScript("read_release.lua", "lib.lua", "rwlib.lua", "rwrelease.lua")
	readRenewScript    = loadScript("read_renew.lua", "lib.lua")
	writeAcquireScript = loadScript("write_acquire.lua", "lib.lua", "rwlib.lua")
	writeReleaseScript = loadScript("write_release.lua", "lib.lua", "rwlib.lua", "rwrelease.lua")
	writeLeaveScript   = loadScript("write_leave.lua", "lib.lua", "rwlib.lua")

	multiAcquireScript = loadScript("multi_acquire.lua", "lib.lua")
	multiReleaseScript = loadScript("multi_release.lua")

	permitAcquireScript = loadScript("permit_acquire.lua", "lib.lua", "permitlib.lua")
	permitReleaseScript = loadScript("permit_release.lua", "lib.lua")
	permitRenewScript   = loadScript("permit_renew.lua", "lib.lua")

	inspectScript = loadScript("inspect.lua", "lib.lua")
)

// A processor sends commands: a Client's go-redis client, or a connection of
// its own (replica acknowledgement: see link.conn).
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// run runs s on keys with args, through the Client's go-redis client (see
// script.send).
func (c *link) run(ctx context.Context, s *script, keys []string, args ...any) *redis.Cmd {
	return s.run(ctx, c.rdb, keys, args...)
}

// run runs s on keys with args through via (see send).
func (s *script) run(ctx context.Context, via processor, keys []string, args ...any) *redis.Cmd {
	argv := make([]any, 3, 3+len(keys)+len(args))
	for _, k := range keys {
		argv = append(argv, k)
	}
	return s.send(ctx, via, len(keys), append(argv, args...))
}

// runIn is run with keys boxed already (see boxed), building the command in
// buf, the caller's buffer for it, which no other call uses until the reply
// has been read: a lock's hot path boxes its keys once, and uses its hold's
// buffer (see hold.argv), so that a Lock+Unlock allocates no command of its
// own.
func (s *script) runIn(ctx context.Context, via processor, buf []any, keys []any, args ...any) *redis.Cmd {
	argv := append(append(buf[:3], keys...), args...)
	return s.send(ctx, via, len(keys), argv)
}

// send sends s with EVALSHA through via: argv is the whole command, its
// first three places left for EVALSHA, the hash and nkeys, followed by the
// nkeys keys and the arguments. A server that does not know the script
// (restarted, failed over, SCRIPT FLUSH) answers NOSCRIPT; the script is
// then sent whole with EVAL, which caches it again. A call that could not
// dial its Cluster node is sent again once the slot map is reloaded (see
// redial). This is the one way every single call of a script goes out;
// pipelines use pipelined.
func (s *script) send(ctx context.Context, via processor, nkeys int, argv []any) *redis.Cmd {
	cmd := s.process(ctx, via, nkeys, argv)
	if nkeys > 0 && notSent(cmd.Err()) {
		if cc, ok := via.(*redis.ClusterClient); ok {
			cmd = s.redial(ctx, cc, nkeys, argv, cmd)
		}
	}
	return cmd
}

// process sends s once through via (see send), as EVAL after NOSCRIPT.
func (s *script) process(ctx context.Context, via processor, nkeys int, argv []any) *redis.Cmd {
	argv[0], argv[1], argv[2] = "evalsha", s.sha, nkeys
	cmd := redis.NewCmd(ctx, argv...)
	if nkeys > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = via.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		argv[0], argv[1] = "eval", s.src
		cmd = redis.NewCmd(ctx, argv...)
		if nkeys > 0 {
			cmd.SetFirstKeyPos(3)
		}
		_ = via.Process(ctx, cmd)
	}
	return cmd
}

// A scriptCall is one call of a script in a pipeline (see pipelined).
type scriptCall struct {
	s    *script
	keys []string
	args []any
}

// pipelined sends calls with EVALSHA through the Client's go-redis client,
// perTrip of them to a pipeline (one round trip), each pipeline under a
// context of its own from newCtx, and returns the replies and when each
// call was sent. A server that lost its script cache (NOSCRIPT) gets each
// such script loaded once (SCRIPT LOAD) and the calls that failed for it
// sent again, the same way. This is the one way the package pipelines its
// scripts (the watchdog's renewals, a MultiLock's token raise).
func (c *link) pipelined(calls []scriptCall, perTrip int, newCtx func() (context.Context, context.CancelFunc)) ([]*redis.Cmd, []time.Time) {
	cmds := make([]*redis.Cmd, len(calls))
	sent := make([]time.Time, len(calls))
	exec := func(idx []int) {
		for len(idx) > 0 {
			n := min(len(idx), perTrip)
			ctx, cancel := newCtx()
			pipe := c.rdb.Pipeline()
			for _, i := range idx[:n] {
				cmds[i] = calls[i].s.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
			}
			at := time.Now()
			_, _ = pipe.Exec(ctx)
			cancel()
			for _, i := range idx[:n] {
				sent[i] = at
			}
			idx = idx[n:]
		}
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	exec(all)
	var again []int
	loaded := make(map[*script]bool)
	for i, cmd := range cmds {
		if !isNoScript(cmd.Err()) {
			continue
		}
		s := calls[i].s
		if _, tried := loaded[s]; !tried {
			ctx, cancel := newCtx()
			loaded[s] = s.Load(ctx, c.rdb).Err() == nil
			cancel()
		}
		if loaded[s] {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		exec(again)
	}
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		// Calls that could not dial their node go again once, after the
		// slot map was reloaded (see redial).
		var unsent []int
		for i, cmd := range cmds {
			if notSent(cmd.Err()) && len(calls[i].keys) > 0 {
				unsent = append(unsent, i)
			}
		}
		if len(unsent) > 0 {
			ctx, cancel := newCtx()
			awaitSlotMap(ctx, cc, calls[unsent[0]].keys[0], slotMapWait)
			cancel()
			exec(unsent)
		}
	}
	return cmds, sent
}

// boxed returns keys as script arguments, boxed once.
func boxed(keys []string) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

// isNoScript reports whether err is Redis' NOSCRIPT reply.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// redial sends the call argv of s again through cc after cmd, its last
// sending, could not dial the node of its first key: once the slot map was
// reloaded, and again with a growing pause while the map still names a node
// that cannot be dialled, until ctx's deadline or for redialFor at most.
func (s *script) redial(ctx context.Context, cc *redis.ClusterClient, nkeys int, argv []any, cmd *redis.Cmd) *redis.Cmd {
	key, _ := argv[3].(string)
	until := time.Now().Add(redialFor)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	for pause := 20 * time.Millisecond; notSent(cmd.Err()); pause = min(2*pause, time.Second) {
		left := time.Until(until)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		awaitSlotMap(ctx, cc, key, min(pause, left))
		cmd = s.process(ctx, cc, nkeys, argv)
	}
	return cmd
}

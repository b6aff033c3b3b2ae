// Package testenv starts the servers the tests of this module run against:
// throwaway redis-server processes on free loopback ports, and fresh
// databases on the MariaDB/MySQL server named by MYSQL_DSN.
//
// Nothing here skips a test. When redis-server or the database is missing the
// test fails with one line that says what to install or which variable to set.
package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server process owned by one test. It keeps nothing on
// disk and is killed when the test ends.
type RedisServer struct {
	Port int    // the loopback port it listens on
	Addr string // "127.0.0.1:<Port>"

	t    testing.TB
	args []string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

var redisPath = sync.OnceValues(func() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("testenv: redis-server not found in PATH: install it (Debian: apt-get install redis-server)")
	}
	return p, nil
})

// Redis starts a redis-server for t on a free loopback port and stops it when
// t ends. extra are additional command-line arguments such as
// "--cluster-enabled", "yes".
func Redis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	s, err := StartRedis(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	t.Cleanup(s.Kill)
	return s
}

// StartRedis starts a redis-server outside a test (for TestMain), keeping its
// log in dir. The caller stops it with Kill.
func StartRedis(dir string, extra ...string) (*RedisServer, error) {
	bin, err := redisPath()
	if err != nil {
		return nil, err
	}
	s := &RedisServer{dir: dir}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s.Port = port
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = append([]string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", s.dir,
			"--logfile", filepath.Join(s.dir, "redis.log"),
		}, extra...)
		if lastErr = s.start(bin); lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("testenv: redis-server did not start: %v", lastErr)
}

func (s *RedisServer) start(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	// The server dies with the test binary even when the binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() { exited <- cmd.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("exited (%v): %s", err, lastLines(string(log), 3))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("not listening on %s after 10s", s.Addr)
		}
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Client returns a go-redis client for the server, closed when the test ends
// (servers started with StartRedis leave closing to the caller).
func (s *RedisServer) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	if s.t != nil {
		s.t.Cleanup(func() { _ = c.Close() })
	}
	return c
}

// Do runs one command on a fresh connection and fails the test on error.
func (s *RedisServer) Do(args ...any) any {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil && err != redis.Nil {
		s.fatalf("testenv: redis %v: %v", args, err)
	}
	return v
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *RedisServer) Kill() { s.signal(syscall.SIGKILL, true) }

// Pause freezes the server with SIGSTOP; Resume thaws it.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP, false) }

// Resume continues a paused server.
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *RedisServer) signal(sig syscall.Signal, wait bool) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	if wait {
		s.cmd = nil
	}
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if wait {
		<-done
	}
}

// Restart starts the server again on the same port after Kill. Its data is
// gone: the server keeps nothing on disk.
func (s *RedisServer) Restart() {
	s.Kill()
	bin, err := redisPath()
	if err != nil {
		s.fatalf("%v", err)
	}
	var lastErr error
	for attempt := 0; attempt < 50; attempt++ {
		if lastErr = s.start(bin); lastErr == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.fatalf("testenv: redis-server did not restart on %s: %v", s.Addr, lastErr)
}

func (s *RedisServer) fatalf(format string, args ...any) {
	if s.t != nil {
		s.t.Helper()
		s.t.Fatalf(format, args...)
	}
	panic(fmt.Sprintf(format, args...))
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testenv: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RunWithRedis is a TestMain's body: it starts one redis-server for each
// environment variable named, points the variable at it (a package's
// examples read their servers' addresses from there), runs m and stops the
// servers. It returns m's exit code, or 1, saying why on stderr, when a
// server did not start.
func RunWithRedis(m *testing.M, envs ...string) int {
	var servers []*RedisServer
	var dirs []string
	defer func() {
		for _, s := range servers {
			s.Kill()
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}()
	for _, env := range envs {
		dir, err := os.MkdirTemp("", "seckillguard-tests")
		if err == nil {
			dirs = append(dirs, dir)
			var srv *RedisServer
			if srv, err = StartRedis(dir); err == nil {
				servers = append(servers, srv)
				os.Setenv(env, srv.Addr)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

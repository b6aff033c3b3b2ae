package faults

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the main package pkg (an import path of this module) into
// a temporary directory of t and returns the binary's path; see BuildIn.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	start := time.Now()
	bin, err := BuildIn(t.TempDir(), pkg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %v", pkg, time.Since(start).Round(time.Millisecond))
	return bin
}

// BuildIn compiles the main package pkg into dir and returns the binary's
// path. It builds with -race when the running binary was, so that the
// compiled dependencies come from the build cache the test itself filled.
func BuildIn(dir, pkg string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, serr := os.Stat(goBin); serr != nil {
			return "", fmt.Errorf("faults: the go command is needed to build %s: not in PATH nor in GOROOT (%v)", pkg, err)
		}
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, pkg)...)
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("faults: go build %s: %v\n%s", pkg, err, msg.String())
	}
	return out, nil
}

// A Process is a child process the test drives through its stdin, one
// command per line, and watches through its stdout, one JSON object per
// line. It is killed when the test ends, and with the test binary.
type Process struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser

	mu     sync.Mutex
	lines  [][]byte
	stderr bytes.Buffer
	change chan struct{} // closed and replaced when a line arrives or the process exits
	exited bool
	err    error // how it exited
}

// Start runs bin with args.
func Start(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	return StartWith(t, nil, bin, args...)
}

// StartWith runs bin with args and, besides the test's environment, the
// variables env ("NAME=value").
func StartWith(t testing.TB, env []string, bin string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Process{t: t, name: filepath.Base(bin), cmd: cmd, change: make(chan struct{})}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{p: p}
	if err := cmd.Start(); err != nil {
		t.Fatalf("faults: start %s: %v", bin, err)
	}
	p.in = in
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := append([]byte(nil), sc.Bytes()...)
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.notify()
			p.mu.Unlock()
		}
	}()
	go func() {
		<-readDone
		err := cmd.Wait()
		p.mu.Lock()
		p.exited, p.err = true, err
		p.notify()
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		p.waitExit(10 * time.Second)
	})
	return p
}

// lockedWriter collects a process's stderr.
type lockedWriter struct{ p *Process }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.stderr.Write(b)
}

// notify wakes the waiters; p.mu is held.
func (p *Process) notify() {
	close(p.change)
	p.change = make(chan struct{})
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Send writes one command line to the process.
func (p *Process) Send(format string, args ...any) {
	p.t.Helper()
	line := fmt.Sprintf(format, args...)
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		p.t.Fatalf("faults: send %q to %s: %v%s", line, p.name, err, p.tail())
	}
}

// Await waits up to d for a line that match accepts (among all lines
// received so far and later ones) and returns it. It fails the test when
// none arrives in time or the process exits first.
func (p *Process) Await(d time.Duration, what string, match func(line []byte) bool) []byte {
	p.t.Helper()
	line, _ := p.AwaitFrom(0, d, what, match)
	return line
}

// AwaitFrom is Await among the lines from index from on (0 is the first
// line); it also returns the index of the line found.
func (p *Process) AwaitFrom(from int, d time.Duration, what string, match func(line []byte) bool) ([]byte, int) {
	p.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	seen := from
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if match(p.lines[seen]) {
				line := p.lines[seen]
				p.mu.Unlock()
				return line, seen
			}
		}
		exited, change := p.exited, p.change
		p.mu.Unlock()
		if exited {
			p.t.Fatalf("faults: %s exited (%v) before %s%s", p.name, p.exitErr(), what, p.tail())
		}
		select {
		case <-change:
		case <-deadline.C:
			p.t.Fatalf("faults: no %s from %s within %v%s", what, p.name, d, p.tail())
		}
	}
}

// Len returns how many lines the process has written so far.
func (p *Process) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// Lines returns every line the process has written so far.
func (p *Process) Lines() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.lines...)
}

// Stop freezes the process with SIGSTOP and returns once the kernel reports
// it stopped, so that nothing it does afterwards can precede the pause.
func (p *Process) Stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatalf("faults: SIGSTOP %s: %v", p.name, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.state() != 'T' {
		if time.Now().After(deadline) {
			p.t.Fatalf("faults: %s not stopped 5s after SIGSTOP (state %c)", p.name, p.state())
		}
		time.Sleep(time.Millisecond)
	}
}

// Cont resumes a process frozen by Stop.
func (p *Process) Cont() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		p.t.Fatalf("faults: SIGCONT %s: %v", p.name, err)
	}
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if !p.waitExit(10 * time.Second) {
		p.t.Fatalf("faults: %s still running 10s after SIGKILL", p.name)
	}
}

// Wait waits up to d for the process to exit by itself and fails the test
// unless it exited with status 0.
func (p *Process) Wait(d time.Duration) {
	p.t.Helper()
	if !p.waitExit(d) {
		p.t.Fatalf("faults: %s still running after %v%s", p.name, d, p.tail())
	}
	if err := p.exitErr(); err != nil {
		p.t.Fatalf("faults: %s exited with %v%s", p.name, err, p.tail())
	}
}

func (p *Process) waitExit(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		exited, change := p.exited, p.change
		p.mu.Unlock()
		if exited {
			return true
		}
		select {
		case <-change:
		case <-deadline.C:
			return false
		}
	}
}

func (p *Process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Stderr returns what the process wrote to stderr so far.
func (p *Process) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// tail is the end of stderr, for error messages.
func (p *Process) tail() string {
	s := strings.TrimSpace(p.Stderr())
	if s == "" {
		return ""
	}
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return "\nstderr of " + p.name + ":\n" + s
}

// state returns the process state letter from /proc (R, S, T, Z, ...).
func (p *Process) state() byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/stat")
	if err != nil {
		return '?'
	}
	// pid (comm) state ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return '?'
	}
	return b[i+2]
}

// Event decodes a JSON line into v, failing the test on malformed output.
func Event[T any](t testing.TB, line []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(line, &v); err != nil {
		t.Fatalf("faults: bad output line %q: %v", line, err)
	}
	return v
}

package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// busyEnv marks a process started by startBusyLoops: it runs busyLoop
// instead of the benchmark.
const busyEnv = "SECKILLGUARD_BENCH_BUSY_LOOP"

// busyLoop keeps one CPU busy at the lowest priority until it is killed.
// A vCPU that never idles is woken by nothing: on a VM whose idle vCPUs
// take tens of microseconds to wake, every round trip otherwise pays that
// wake-up, and the uncontended runs measure the host rather than the locks.
// At nice 19 the loop gives way to any other task that becomes runnable.
func busyLoop() {
	runtime.GOMAXPROCS(1)
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19)
	for {
	}
}

// startBusyLoops starts n processes running busyLoop (this program again,
// marked by busyEnv) and returns the function that stops them.
func startBusyLoops(n int) (stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("-busy: %w", err)
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command(exe)
		c.Env = append(os.Environ(), busyEnv+"=1")
		// The loops die with the benchmark even when it is killed.
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("-busy: start a busy loop: %w", err)
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}

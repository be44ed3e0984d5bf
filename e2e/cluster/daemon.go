package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// daemon is a process the cluster started; it outlives the command that
// started it (its own session, no parent-death signal) and is found again
// through its pid file.
type daemon struct {
	name string
	pid  int
	done chan struct{} // closed when it exits while we still run
}

// exited reports whether the daemon has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// startDaemon starts argv in network namespace ns with its output in
// logs/<name>.log and its pid in pids/<name>.pid.
func (l Layout) startDaemon(name, ns string, argv []string) (*daemon, error) {
	return l.startDaemonEnv(name, ns, argv, nil)
}

// startDaemonEnv is startDaemon with env added to daemonEnv.
func (l Layout) startDaemonEnv(name, ns string, argv, env []string) (*daemon, error) {
	for _, d := range []string{filepath.Dir(l.logFile(name)), filepath.Dir(l.pidFile(name))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	logf, err := os.OpenFile(l.logFile(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	full := nsenter(ns, argv...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(l.daemonEnv(), env...)
	cmd.Dir = l.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(d.done)
	}()
	if err := os.WriteFile(l.pidFile(name), []byte(strconv.Itoa(d.pid)+"\n"), 0o644); err != nil {
		return d, err
	}
	return d, nil
}

// daemonEnv is the environment of every daemon: the contract's binaries
// first on PATH (containerd must find its own shim before Debian's), no
// proxy settings (every address is inside the cluster's namespaces).
func (l Layout) daemonEnv() []string {
	env := []string{"HOME=/root", "LANG=C",
		"PATH=" + l.ClusterBin("") + ":" + l.K8sBin("") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return env
}

// pidOf reads a daemon's pid file; 0 when there is none.
func (l Layout) pidOf(name string) int {
	b, err := os.ReadFile(l.pidFile(name))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// stopDaemon sends SIGTERM to the daemon named in its pid file, waits up
// to grace, then SIGKILLs it.
func (l Layout) stopDaemon(name string, grace time.Duration) error {
	pid := l.pidOf(name)
	if !alive(pid) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s[%d]: %w", name, pid, err)
	}
	if waitGone([]int{pid}, grace) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if !waitGone([]int{pid}, 10*time.Second) {
		return fmt.Errorf("%s[%d] still alive after SIGKILL", name, pid)
	}
	return nil
}

// waitGone polls until none of pids is alive, or the timeout passes.
func waitGone(pids []int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		any := false
		for _, p := range pids {
			if alive(p) {
				any = true
				break
			}
		}
		if !any {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

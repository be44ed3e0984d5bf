package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// errStuck marks a process that did not exit even after SIGKILL.
var errStuck = errors.New("did not exit after SIGKILL")

// Process is a command started in the background with Start or StartCmd.
// The sandbox waits for it; use Wait or Done, never Cmd.Wait.
type Process struct {
	Cmd *exec.Cmd // the started command; its Process field is set
	NS  string    // the logical namespace it runs in

	done chan struct{}
	err  error
}

func newProcess(ns string, cmd *exec.Cmd) *Process {
	p := &Process{Cmd: cmd, NS: ns, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		for _, w := range []any{cmd.Stdout, cmd.Stderr} {
			if lw, ok := w.(*lineWriter); ok {
				lw.flush()
			}
		}
		close(p.done)
	}()
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited and been waited for.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits for the process to exit and returns what exec.Cmd.Wait
// returned. It may be called any number of times, concurrently.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// Signal sends sig to the process's group (the process and its children),
// unless it has already exited.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return os.ErrProcessDone
	}
	return signalGroup(p.Cmd.Process, sig)
}

// Stop sends SIGTERM and waits up to timeout, then SIGQUIT (a Go program
// dumps its goroutines) and waits a second, then SIGKILL and waits up to
// timeout again. It returns Wait's result: nil for a clean exit, an
// *exec.ExitError for a non-zero status or death by signal.
func (p *Process) Stop(timeout time.Duration) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGKILL} {
		if err := p.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("%s: %w", p, err)
		}
		wait := timeout
		if sig == syscall.SIGQUIT {
			// A Go program prints every goroutine's stack and exits: the
			// log then shows where it was stuck.
			wait = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-p.done:
			t.Stop()
			return p.err
		case <-t.C:
		}
	}
	return fmt.Errorf("%s: %w (threads: %s)", p, errStuck, taskStates(p.Pid()))
}

// taskStates describes what each thread of a stuck process waits on:
// its state letter and kernel wait channel, from /proc.
func taskStates(pid int) string {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, d := range dirs {
		base := fmt.Sprintf("/proc/%d/task/%s/", pid, d.Name())
		stat, _ := os.ReadFile(base + "stat")
		wchan, _ := os.ReadFile(base + "wchan")
		state := "?"
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		out = append(out, fmt.Sprintf("%s:%s/%s", d.Name(), state, wchan))
	}
	return strings.Join(out, " ")
}

// String names the process for messages: "node/kube-nftproxy[1234]".
func (p *Process) String() string {
	name := "?"
	if args := cmdArgs(p.Cmd); len(args) > 0 {
		name = baseName(args[0])
	}
	return fmt.Sprintf("%s/%s[%d]", p.NS, name, p.Pid())
}

// signalGroup signals the process group led by proc (every command built by
// Command leads its own group).
func signalGroup(proc *os.Process, sig syscall.Signal) error {
	if proc == nil {
		return os.ErrProcessDone
	}
	if err := syscall.Kill(-proc.Pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return fmt.Errorf("signal %v to process group %d: %w", sig, proc.Pid, err)
	}
	return nil
}

// lineWriter hands complete lines to logf, each with a prefix.
type lineWriter struct {
	prefix string
	logf   func(format string, args ...any)

	mu  sync.Mutex
	buf []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.logf("%s%s", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	// Do not hold an unbounded partial line.
	if len(w.buf) > 4096 {
		w.logf("%s%s", w.prefix, w.buf)
		w.buf = w.buf[:0]
	}
	return len(b), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.logf("%s%s", w.prefix, w.buf)
		w.buf = nil
	}
}

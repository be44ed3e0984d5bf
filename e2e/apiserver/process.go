package apiserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// proc is one started etcd or kube-apiserver.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProc starts argv[0] with its output appended to logPath. The child
// leads its own process group and is SIGKILLed if the test binary dies.
func startProc(name, logPath string, argv []string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	// Pdeathsig fires when the OS thread that forked the child exits, not
	// the process: fork from a goroutine locked to its thread, which stays
	// alive until the child has been reaped. Otherwise a thread that some
	// other goroutine later locks and ends (netns code does) would take
	// kube-apiserver down with it.
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err != nil {
			return
		}
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// childEnv is the environment for etcd and kube-apiserver: the test's,
// without proxy settings (every address they use is 127.0.0.1).
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY":
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process group, waits up to grace, then SIGKILLs it
// and waits for it to be reaped.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s[%d]: %w", p.name, pid, err)
	}
	if sig != syscall.SIGKILL {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return nil
		case <-t.C:
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s[%d] did not exit after SIGKILL", p.name, pid)
	}
}

// logTail returns the last n lines of a log file.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	// Read at most the last 256 KiB.
	if st, err := f.Stat(); err == nil && st.Size() > 256<<10 {
		_, _ = f.Seek(st.Size()-256<<10, io.SeekStart)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

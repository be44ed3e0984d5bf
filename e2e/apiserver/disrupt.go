package apiserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// RestartEtcd SIGKILLs etcd (as a crash would) and starts it again on the
// same URLs and data directory, waiting until it is healthy. kube-apiserver
// keeps running and reconnects to it by itself.
func (s *Server) RestartEtcd(ctx context.Context) error {
	s.mu.Lock()
	etcd, stopped := s.etcd, s.stopped
	s.mu.Unlock()
	if stopped {
		return errors.New("apiserver: server was stopped")
	}
	if err := etcd.stop(syscall.SIGKILL, 0); err != nil {
		return fmt.Errorf("kill etcd: %w", err)
	}
	return s.startEtcdAgain(ctx)
}

// startEtcdAgain starts etcd as before on its data directory and waits
// until it is healthy.
func (s *Server) startEtcdAgain(ctx context.Context) error {
	s.mu.Lock()
	p, err := startProc("etcd", s.etcdLog, s.inNetNS(s.etcdArgv))
	if err == nil {
		s.etcd = p
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.waitEtcd(ctx); err != nil {
		return fmt.Errorf("etcd after a restart: %w; log: %s", err, logTail(s.etcdLog, 20))
	}
	return nil
}

// PauseAPIServer stops kube-apiserver with SIGSTOP: its sockets stay open
// and connections to it are accepted by the kernel, but nothing answers,
// as with a hung server. It returns once every thread has stopped (the
// signal stops them one by one, and a running thread could still answer
// a request sent right after kill returned). ResumeAPIServer lets it run
// again; Stop kills it either way.
func (s *Server) PauseAPIServer() error {
	if err := s.SignalAPIServer(syscall.SIGSTOP); err != nil {
		return err
	}
	s.mu.Lock()
	pid := s.api.cmd.Process.Pid
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver[%d]: threads still running 10s after SIGSTOP", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// allThreadsStopped reports whether every thread of pid is in state T
// (stopped), from /proc/PID/task/*/stat.
func allThreadsStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			return false
		}
		// The state follows the command, which is in parentheses and
		// may itself hold spaces or parentheses.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}

// ResumeAPIServer sends SIGCONT to a kube-apiserver that PauseAPIServer
// stopped, and waits until it is ready again.
func (s *Server) ResumeAPIServer(ctx context.Context) error {
	if err := s.SignalAPIServer(syscall.SIGCONT); err != nil {
		return err
	}
	return s.WaitReady(ctx)
}

// SignalAPIServer sends sig to kube-apiserver's process group: SIGSTOP
// hangs it (connections are accepted, nothing answers), SIGCONT resumes it.
func (s *Server) SignalAPIServer(sig syscall.Signal) error {
	s.mu.Lock()
	api := s.api
	s.mu.Unlock()
	if api == nil || api.exited() {
		return errors.New("apiserver: kube-apiserver is not running")
	}
	if err := syscall.Kill(-api.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal %s to kube-apiserver[%d]: %w", sig, api.cmd.Process.Pid, err)
	}
	return nil
}

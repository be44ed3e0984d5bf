package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns` keeps its named network namespaces.
const netnsDir = "/run/netns"

// inNetNS returns argv prefixed with `ip netns exec NetNS` when
// Options.NetNS is set, else argv itself. `ip netns exec` execs the command
// in place, so the process, its group and its Pdeathsig are the command's.
func (s *Server) inNetNS(argv []string) []string {
	if s.opts.NetNS == "" {
		return argv
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		ip = "/usr/sbin/ip"
	}
	return append([]string{ip, "netns", "exec", s.opts.NetNS}, argv...)
}

// freePort returns a TCP port that was free on 127.0.0.1 (of Options.NetNS
// when set) a moment ago.
func (s *Server) freePort() (int, error) {
	if s.opts.NetNS == "" {
		return freePort()
	}
	var port int
	err := RunInNetNS(s.opts.NetNS, func() error {
		var err error
		port, err = freePort()
		return err
	})
	return port, err
}

// dialContext returns nil (http.Transport's default dialer) without
// Options.NetNS, else a DialContext that opens its connections inside
// NetNS.
func (s *Server) dialContext() func(ctx context.Context, network, addr string) (net.Conn, error) {
	ns := s.opts.NetNS
	if ns == "" {
		return nil
	}
	return DialerInNetNS(ns)
}

// DialerInNetNS returns a DialContext (for http.Transport) that opens its
// connections inside the named network namespace ns.
func DialerInNetNS(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := RunInNetNS(ns, func() error {
			var err error
			// The socket is created on this goroutine's (locked) thread,
			// so in ns; once created it stays there, whatever thread
			// later uses it. addr is an IP literal: no resolver goroutine.
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// RunInNetNS runs fn on a fresh goroutine locked to its OS thread, with that
// thread switched into the named network namespace ns and back. If the
// thread cannot be switched back, the goroutine ends still locked, which
// makes the runtime discard the thread instead of reusing it. A socket fn
// creates stays in ns whichever thread uses it later.
func RunInNetNS(ns string, fn func() error) error {
	target, err := os.Open(filepath.Join(netnsDir, ns))
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread dies with this goroutine.
			done <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

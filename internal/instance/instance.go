// Package instance keeps one kube-nftproxy per network namespace: two would
// rewrite each other's tables at every sync.
package instance

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// Name is the abstract unix socket that marks a running instance. Abstract
// sockets belong to a network namespace and vanish when their process
// dies, however it dies, so there is no stale lock to clean up.
const Name = "kube-nftproxy"

// Lock is held while the process runs.
type Lock struct{ fd int }

// ErrRunning is returned by Acquire when another instance holds the lock.
var ErrRunning = errors.New("another kube-nftproxy is running in this network namespace")

// Acquire takes the lock of the current network namespace, or says which
// process holds it.
func Acquire() (*Lock, error) { return acquire("") }

// acquire takes the lock of the network namespace at netnsPath ("" for
// the current one).
func acquire(netnsPath string) (*Lock, error) {
	fd := -1
	err := netns.Do(netnsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("instance lock: socket: %w", err)
	}
	addr := &unix.SockaddrUnix{Name: "@" + Name}
	err = unix.Bind(fd, addr)
	if err == nil {
		err = unix.Listen(fd, 1)
	}
	if err == nil {
		return &Lock{fd: fd}, nil
	}
	unix.Close(fd)
	if !errors.Is(err, unix.EADDRINUSE) {
		return nil, fmt.Errorf("instance lock: %w", err)
	}
	if pid := holder(netnsPath, addr); pid > 0 {
		return nil, fmt.Errorf("%w (pid %d)", ErrRunning, pid)
	}
	return nil, ErrRunning
}

// holder connects to the lock and asks the kernel for its owner's pid.
func holder(netnsPath string, addr *unix.SockaddrUnix) int {
	fd := -1
	err := netns.Do(netnsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	if unix.Connect(fd, addr) != nil {
		return 0
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0
	}
	return int(cred.Pid)
}

// Release gives the lock up.
func (l *Lock) Release() error { return unix.Close(l.fd) }

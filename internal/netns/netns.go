// Package netns runs code inside another network namespace, for opening
// sockets there: a socket stays in the namespace it was created in.
package netns

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do calls fn on a thread that is inside the network namespace at path
// (e.g. /run/netns/NAME), or in the current one when path is empty.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("reading the current network namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", path, err)
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// This thread is in the wrong namespace: never give it back to the runtime.
		runtime.Goexit()
	}
	return fnErr
}

// NetlinkSocket opens and binds a netlink socket of the given protocol
// (e.g. unix.NETLINK_NETFILTER) in the network namespace at path ("" for
// the current one).
func NetlinkSocket(path string, protocol int) (int, error) {
	fd := -1
	err := Do(path, func() error {
		s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, protocol)
		if err != nil {
			return fmt.Errorf("opening a netlink socket: %w", err)
		}
		if err := unix.Bind(s, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			unix.Close(s)
			return fmt.Errorf("binding a netlink socket: %w", err)
		}
		fd = s
		return nil
	})
	return fd, err
}

// Addrs lists the addresses of the current network namespace.
func Addrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing the node's addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

package netns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/nlmsg"
)

// AddrsExcept lists the addresses of the current network namespace's
// interfaces but those named in skip, sorted and without duplicates.
//
// The kernel is asked for each wanted interface's addresses alone (a dump
// filtered by interface index, under strict checking): skip is for
// interfaces like kube-ipvs0 with an address per Service, which a plain
// dump (and net.Interface.Addrs, one plain dump per interface) would read
// on every call.
func AddrsExcept(skip ...string) ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the node's interfaces: %w", err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening an rtnetlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		return nil, fmt.Errorf("rtnetlink strict checking: %w", err)
	}
	buf := make([]byte, 1<<16)
	var out []netip.Addr
	for i, ifc := range ifaces {
		if slices.Contains(skip, ifc.Name) {
			continue
		}
		addrs, err := ifaceAddrs(fd, buf, uint32(i+1), ifc.Index)
		if err != nil {
			return nil, fmt.Errorf("listing the addresses of %s: %w", ifc.Name, err)
		}
		out = append(out, addrs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// ifaceAddrs dumps the addresses of the interface with index ifindex.
func ifaceAddrs(fd int, buf []byte, seq uint32, ifindex int) ([]netip.Addr, error) {
	req := make([]byte, nlmsg.HdrLen+unix.SizeofIfAddrmsg)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETADDR)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], seq)
	// struct ifaddrmsg: family (AF_UNSPEC: both), prefixlen, flags, scope, index.
	binary.NativeEndian.PutUint32(req[nlmsg.HdrLen+4:], uint32(ifindex))
	if err := nlmsg.Send(fd, req); err != nil {
		return nil, err
	}
	var out []netip.Addr
	err := nlmsg.ReceiveAnswers(fd, buf, seq, func(typ uint16, p []byte) {
		// Older kernels ignore the filter: check the index too.
		if typ != unix.RTM_NEWADDR || len(p) < unix.SizeofIfAddrmsg || int(binary.NativeEndian.Uint32(p[4:8])) != ifindex {
			return
		}
		if a, ok := ifaddr(p[0], p[unix.SizeofIfAddrmsg:]); ok {
			out = append(out, a)
		}
	})
	return out, err
}

// ifaddr is an address message's address: IFA_LOCAL for IPv4 (IFA_ADDRESS
// is the peer on point-to-point links), IFA_ADDRESS otherwise.
func ifaddr(family byte, attrs []byte) (netip.Addr, bool) {
	var local, address []byte
	nlmsg.Walk(attrs, func(typ uint16, data []byte) {
		switch typ {
		case unix.IFA_LOCAL:
			local = data
		case unix.IFA_ADDRESS:
			address = data
		}
	})
	raw := address
	if family == unix.AF_INET && local != nil {
		raw = local
	}
	a, ok := netip.AddrFromSlice(raw)
	return a.Unmap(), ok
}

// AddrCache is AddrsExcept that reads the kernel again only after an
// address changed on an interface it does not skip (or it could not
// tell): the kernel's address events, on a socket of its own, say when.
// A proxy asks for the node's addresses at every sync; they rarely change,
// while kube-ipvs0's change with every Service.
type AddrCache struct {
	skip   []string
	fd     int
	buf    []byte
	addrs  []netip.Addr
	skipIx map[int32]bool // the skipped interfaces' indexes, as of the last read
	valid  bool
}

// NewAddrCache subscribes to the current network namespace's address
// events. Close it when done.
func NewAddrCache(skip ...string) (*AddrCache, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening an rtnetlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("following address changes: %w", err)
	}
	return &AddrCache{skip: skip, fd: fd, buf: make([]byte, 1<<16)}, nil
}

// Close stops following address changes.
func (c *AddrCache) Close() error { return unix.Close(c.fd) }

// Addrs returns the addresses of every interface but the skipped ones.
func (c *AddrCache) Addrs() ([]netip.Addr, error) {
	if c.valid && !c.changed() {
		return c.addrs, nil
	}
	// Read the indexes first: an event after this is seen next time.
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the node's interfaces: %w", err)
	}
	c.skipIx = map[int32]bool{}
	for _, ifc := range ifaces {
		if slices.Contains(c.skip, ifc.Name) {
			c.skipIx[int32(ifc.Index)] = true
		}
	}
	addrs, err := AddrsExcept(c.skip...)
	if err != nil {
		c.valid = false
		return nil, err
	}
	c.addrs, c.valid = addrs, true
	return addrs, nil
}

// changed drains the queued events: true when one is for an interface not
// skipped, or some were lost.
func (c *AddrCache) changed() bool {
	changed := false
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_TRUNC)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return changed
		case err != nil, n > len(c.buf): // ENOBUFS: events were lost
			changed = true
			continue
		}
		_ = nlmsg.EachMessage(c.buf[:n], func(typ uint16, _ uint32, p []byte) {
			if (typ == unix.RTM_NEWADDR || typ == unix.RTM_DELADDR) && len(p) >= unix.SizeofIfAddrmsg &&
				c.skipIx[int32(binary.NativeEndian.Uint32(p[4:8]))] {
				return
			}
			changed = true
		})
	}
}

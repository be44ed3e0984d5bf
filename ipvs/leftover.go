package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// DummyAddrs returns kube-ipvs0's addresses in the current network
// namespace or the one at netnsPath, without creating the link; exists is
// false when there is no kube-ipvs0.
func DummyAddrs(netnsPath string) (addrs []netip.Addr, exists bool, err error) {
	fd, err := netns.NetlinkSocket(netnsPath, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, false, err
	}
	d := &Dummy{fd: fd, buf: make([]byte, 1<<16)}
	defer d.Close()
	err = d.findIndex()
	if errors.Is(err, unix.ENODEV) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	addrs, err = d.Addrs()
	if err != nil {
		return nil, true, fmt.Errorf("listing the addresses of %s: %w", DummyName, err)
	}
	return addrs, true, nil
}

// DeleteUpstreamLeftovers removes what upstream kube-proxy's IPVS mode
// leaves behind when another mode takes over: the virtual servers on
// kube-ipvs0's addresses (through k; nil for a kernel without IPVS), then
// kube-ipvs0 itself. Virtual servers on other addresses (NodePorts on the
// node's, or someone else's) stay. It is not for IPVS mode, whose own
// kube-ipvs0 and virtual servers these are.
func DeleteUpstreamLeftovers(netnsPath string, k Kernel) (servers int, link bool, err error) {
	addrs, exists, err := DummyAddrs(netnsPath)
	if err != nil || !exists {
		return 0, false, err
	}
	if k != nil && len(addrs) > 0 {
		on := map[netip.Addr]bool{}
		for _, a := range addrs {
			on[a] = true
		}
		servers, err = deleteVirtualServersIf(k, "on "+DummyName, func(v VirtualServer) bool { return on[v.Addr] })
		if err != nil {
			return servers, false, err
		}
	}
	link, err = DeleteDummy(netnsPath)
	return servers, link, err
}

package netns

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// AddrsExcept lists the addresses of the current network namespace's
// interfaces but those named in skip, sorted and without duplicates.
func AddrsExcept(skip ...string) ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the node's interfaces: %w", err)
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if slices.Contains(skip, ifc.Name) {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing the addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

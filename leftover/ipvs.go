package leftover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
)

// cleanIPVS removes kube-ipvs0 and the virtual servers on its addresses.
func cleanIPVS(netnsPath string, res *Result) error {
	var k ipvsnl.Kernel
	if hasIPVS(netnsPath) {
		conn, err := ipvsnl.Dial(netnsPath)
		switch {
		case errors.Is(err, ipvsnl.ErrNoIPVS):
		case err != nil:
			return fmt.Errorf("opening IPVS: %w", err)
		default:
			defer conn.Close()
			k = conn
		}
	}
	servers, link, err := ipvsnl.DeleteDummyAndServers(netnsPath, k)
	if servers > 0 {
		res.Removed = append(res.Removed, fmt.Sprintf("%d IPVS virtual servers on %s", servers, ipvsnl.DummyName))
		res.add("ipvs_virtual_server", servers)
	}
	if link {
		res.Removed = append(res.Removed, "link "+ipvsnl.DummyName)
		res.add("ipvs_link", 1)
	}
	if err != nil {
		return fmt.Errorf("removing upstream IPVS mode's %s: %w", ipvsnl.DummyName, err)
	}
	return nil
}

// hasIPVS reports whether the kernel has IPVS in the network namespace.
func hasIPVS(netnsPath string) bool {
	ok := false
	_ = netns.Do(netnsPath, func() error {
		_, err := os.Stat(filepath.Join("/proc/thread-self/net", "ip_vs"))
		ok = err == nil
		return nil
	})
	return ok
}

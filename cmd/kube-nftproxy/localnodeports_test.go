package main

import (
	"fmt"
	"testing"
)

// The userspace proxy runs in nftables mode with the gate on, per family
// whose NodePort addresses name loopback explicitly, as kube-proxy's.
func TestLocalhostFamilies(t *testing.T) {
	on := map[string]bool{gateLocalhostNodePorts: true}
	for _, tc := range []struct {
		mode  string
		gates map[string]bool
		addrs []string
		want  string
	}{
		{modeNFTables, on, []string{"primary", "localhost"}, "[127.0.0.1 ::1]"},
		{modeNFTables, on, []string{"127.0.0.1/32"}, "[127.0.0.1]"},
		{modeNFTables, on, []string{"::1/128", "10.0.0.0/8"}, "[::1]"},
		{modeNFTables, on, []string{"all"}, "[]"},        // 0.0.0.0/0 holds loopback but does not name it
		{modeNFTables, on, nil, "[]"},                    // primary, nftables mode's default
		{modeNFTables, nil, []string{"localhost"}, "[]"}, // the gate's default: off
		{modeIPTables, on, []string{"localhost"}, "[]"},  // iptables mode: route_localnet instead
	} {
		o := &options{proxyMode: tc.mode, nodePortAddrs: tc.addrs, detectLocalMode: "ClusterCIDR", masqueradeBit: 14}
		cfg, err := o.nftConfig()
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(localhostFamilies(tc.mode, tc.gates, cfg)); got != tc.want {
			t.Errorf("%s, gates %v, --nodeport-addresses %v: %s, want %s", tc.mode, tc.gates, tc.addrs, got, tc.want)
		}
	}
}

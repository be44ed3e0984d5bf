package proxy

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// tamperSyncPeriod is the --iptables-sync-period of the tampering test: the
// most time until the periodic check sees what was done to the tables.
const tamperSyncPeriod = 2 * time.Second

// TestFaultTampering changes the proxy's tables by hand with nft, one
// tampering at a time, under traffic to the example's Services: each must
// be repaired by the next periodic check (within a few sync periods), after
// which `nft list ruleset` is again exactly what `render` prints for the
// same state. Some tamperings break the good Service until repaired; their
// failed connections are reported, not judged.
func TestFaultTampering(t *testing.T) {
	t.Parallel()
	args := []string{"--iptables-sync-period", tamperSyncPeriod.String()}
	e := newEnv(t, envOptions{pods: []sandbox.Pod{podA, podB, podC}, proxyArgs: args})
	// The comparison must hold before any tampering, or it proves nothing.
	e.waitRendered(t, 10*time.Second, "before tampering")

	svc := svcChain(webSPN, "tcp")
	sep := sepChain(webSPN, "tcp", netip.AddrPortFrom(podA.IPv4, podTCPPort))
	const table = "ip kube-nftproxy"
	for _, tc := range []struct{ name, script string }{
		{"KUBE-SEP chain deleted", fmt.Sprintf(
			// Its KUBE-SVC chain's goto holds it: flush that first.
			"flush chain %[1]s %[2]s\nflush chain %[1]s %[3]s\ndelete chain %[1]s %[3]s\n", table, svc, sep)},
		{"base chain deleted", fmt.Sprintf("delete chain %s nat-prerouting\n", table)},
		{"table flushed", fmt.Sprintf("flush table %s\n", table)},
		{"service-ips element removed", fmt.Sprintf("delete element %s service-ips { %s . tcp . %s }\n", table, webClusterIPv4, webPort)},
		{"rogue drop rule in KUBE-SERVICES", fmt.Sprintf("insert rule %s KUBE-SERVICES meta l4proto udp drop\n", table)},
		{"rogue drop base chain in our table", fmt.Sprintf(
			"add chain %s rogue-drop { type filter hook prerouting priority -300; policy drop; }\n", table)},
		{"base chain re-created with policy drop", fmt.Sprintf(
			"delete chain %[1]s filter-forward\nadd chain %[1]s filter-forward { type filter hook forward priority filter; policy drop; }\n", table)},
		{"table deleted", fmt.Sprintf("delete table %s\n", table)},
	} {
		ok := t.Run(tc.name, func(t *testing.T) {
			e.proxy.checkRunning(t)
			f := e.startExampleFlows(t)
			t0 := time.Now()
			if err := e.nftScript(t.Context(), tc.script); err != nil {
				t.Fatal(err)
			}
			e.waitRendered(t, 6*tamperSyncPeriod, "after "+tc.name)
			repaired := time.Since(t0)
			// Traffic works again. Each request may take up to 3 s: under
			// the whole suite's load a TCP request once timed out at 1 s
			// just after the repair (the kernel sends a lost SYN again
			// after 1 s), while a rule that still drops fails at any
			// timeout.
			for _, c := range []struct{ proto, addr string }{
				{"tcp", hostPort(webClusterIPv4, webPort)},
				{"udp", hostPort(dnsClusterIP, dnsPort)},
			} {
				sum := e.requestsWithin(t, podC.Name, c.proto, c.addr, requestsPerCheck, 3*time.Second)
				expectBackends(t, fmt.Sprintf("after %s was repaired: %s to %s", tc.name, c.proto, c.addr), sum, podA.Name, podB.Name)
			}
			// The flows count what the tampering broke until the
			// repair (each failed request waits for its 1s timeout);
			// that traffic works again is checked above.
			res := f.stop(t)
			logFault(t, "nft: "+tc.name, repaired, res)
		})
		if !ok {
			// Not repaired: start afresh, so that the next tampering
			// is judged on its own.
			e.resetProxy(t, args...)
		}
	}
	e.proxy.checkRunning(t)
}

package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestNodePortPrimaryDefault: in nftables mode without --nodeport-addresses,
// as kube-proxy's nftables mode (whose default is "primary"), NodePorts
// answer on the Node object's primary address of each family and not on
// another address of the node; they follow the Node object when its
// InternalIPs change; and while the Node has no address of a family, that
// family's NodePorts answer on every node address, as kube-proxy's
// NodePortAddresses does for a family it has no address for.
func TestNodePortPrimaryDefault(t *testing.T) {
	t.Parallel()
	needRoot(t)
	e := newFlagsEnv(t, nil) // --proxy-mode=nftables, no --nodeport-addresses
	flagsAddNodeAddr2(t, e)
	for _, f := range flagsFamilies {
		t.Run("primary/"+f.name, func(t *testing.T) {
			flagsExpectAnswered(t, e, flagsNodePort(f.node))
			flagsExpectRefused(t, e, flagsNodePort(f.node2))
		})
	}

	// The Node's InternalIPs become the second addresses.
	writeNodeObject(t, e.state, flagsFamilies[0].node2, flagsFamilies[1].node2)
	for _, f := range flagsFamilies {
		t.Run("moved/"+f.name, func(t *testing.T) {
			waitNodePort(t, e, flagsNodePort(f.node2), true)
			waitNodePort(t, e, flagsNodePort(f.node), false)
		})
	}

	// No InternalIP of either family: every node address.
	writeNodeObject(t, e.state)
	for _, f := range flagsFamilies {
		t.Run("no node IPs/"+f.name, func(t *testing.T) {
			waitNodePort(t, e, flagsNodePort(f.node), true)
			waitNodePort(t, e, flagsNodePort(f.node2), true)
		})
	}
}

// writeNodeObject replaces the state's Node (node-1) with one whose
// InternalIPs are ips, atomically (a hidden file renamed over node.yaml).
func writeNodeObject(t *testing.T, state string, ips ...netip.Addr) {
	t.Helper()
	body := "apiVersion: v1\nkind: Node\nmetadata:\n  name: " + nodeName + "\n" +
		"  labels: {kubernetes.io/hostname: " + nodeName + ", topology.kubernetes.io/zone: zone-a}\n" +
		"spec:\n  podCIDR: 10.244.0.0/24\n  podCIDRs: [10.244.0.0/24, \"fd00:10:244::/64\"]\n" +
		"status:\n  addresses:\n  - {type: Hostname, address: " + nodeName + "}\n"
	for _, ip := range ips {
		body += fmt.Sprintf("  - {type: InternalIP, address: %q}\n", ip)
	}
	tmp := filepath.Join(state, ".node.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(state, "node.yaml")); err != nil {
		t.Fatal(err)
	}
}

// waitNodePort polls until TCP from the client to addr is answered by a
// pod (answered) or refused by the node (not answered).
func waitNodePort(t *testing.T, e *env, addr string, answered bool) {
	t.Helper()
	what := fmt.Sprintf("tcp from the client to %s answered: %v", addr, answered)
	e.proxy.poll(t, 20*time.Second, what, func(ctx context.Context) error {
		sum, err := e.client(ctx, sandbox.Client, "tcp", addr, 1, "--timeout", "1s", "--results", "all")
		switch {
		case sum == nil:
			return err
		case answered && sum.OK == 1, !answered && sum.Errors["refused"] == 1:
			return nil
		}
		return fmt.Errorf("%d answers, errors %v", sum.OK, sum.Errors)
	})
	if answered {
		flagsExpectAnswered(t, e, addr)
	} else {
		flagsExpectRefused(t, e, addr)
	}
}

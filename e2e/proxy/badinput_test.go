package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestBadInput starts the proxy on the example state plus a Service with an
// invalid clusterIP and a file that is no YAML: it must say what it skipped
// and program the rest; and once the broken file is fixed, pick that up.
func TestBadInput(t *testing.T) {
	e := newEnv(t, envOptions{extra: badInput})

	for _, want := range []struct{ what, text string }{
		{"the Service with the invalid clusterIP", "default/bad"},
		{"the unparsable file", "broken.yaml"},
	} {
		e.proxy.waitLog(t, 5*time.Second, "a warning naming "+want.what, func(lines []string) bool {
			return slices.ContainsFunc(lines, func(l string) bool {
				return (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")) &&
					strings.Contains(l, want.text)
			})
		})
	}

	for _, tc := range []struct{ proto, addr string }{
		{"tcp", hostPort(webClusterIPv4, webPort)},
		{"tcp", hostPort(webClusterIPv6, webPort)},
		{"udp", hostPort(dnsClusterIP, dnsPort)},
	} {
		sum := e.requests(t, podA.Name, tc.proto, tc.addr, requestsPerCheck)
		expectBackends(t, fmt.Sprintf("%s from pod-a to %s", tc.proto, tc.addr), sum, podA.Name, podB.Name)
	}
	sum := e.requests(t, sandbox.Client, "tcp", hostPort(sandbox.NodeIPv4.Addr().String(), webNodePort), requestsPerCheck)
	expectBackends(t, "tcp from the client to the NodePort", sum, podA.Name, podB.Name)

	out, err := e.sb.Exec(t.Context(), sandbox.Node, "nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "default/bad") {
		t.Errorf("the skipped Service default/bad is in the ruleset:\n%s", out)
	}

	// Fixed: broken.yaml now holds a good Service, backed by pod-b.
	fixedIP := netip.MustParseAddr("10.96.0.20")
	writeAtomic(t, e.state, "broken.yaml", documents(
		service{namespace: "default", name: "fixed", clusterIP: fixedIP, portName: "http", protocol: "TCP", port: 80, targetPort: podTCPPort}.yaml(),
		endpointSlice{namespace: "default", name: "fixed-ipv4", service: "fixed", portName: "http", protocol: "TCP", port: podTCPPort, pods: []sandbox.Pod{podB}}.yaml(),
	))
	addr := hostPort(fixedIP.String(), "80")
	e.proxy.poll(t, 10*time.Second, "the fixed Service to answer", func(ctx context.Context) error {
		_, err := e.client(ctx, podA.Name, "tcp", addr, 1, "--timeout", "200ms")
		return err
	})
	sum = e.requests(t, podA.Name, "tcp", addr, requestsPerCheck)
	expectBackends(t, "tcp from pod-a to the fixed Service "+addr, sum, podB.Name)
	e.proxy.checkRunning(t)
}

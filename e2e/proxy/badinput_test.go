package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
	"github.com/kube-nftproxy/kube-nftproxy/internal/instance"
	"github.com/kube-nftproxy/kube-nftproxy/sysctlrecord"
)

// TestBadInput starts the proxy on the example state plus a Service with an
// invalid clusterIP: it must say what it skipped and program the rest. A
// file that is no YAML, added later, is named in the log and changes
// nothing; once it is fixed, the proxy picks it up.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{extra: map[string]string{"bad-service.yaml": badService}})
	writeAtomic(t, e.state, "broken.yaml", brokenYAML)

	for _, want := range []struct{ what, text string }{
		{"the Service with the invalid clusterIP", "default/bad"},
		{"the unparsable file", "broken.yaml"},
	} {
		e.proxy.waitLog(t, 5*time.Second, "a warning naming "+want.what, func(lines []string) bool {
			return slices.ContainsFunc(lines, func(l string) bool {
				return (isWarningLine(l) || isErrorLine(l)) &&
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

// TestBrokenFileHoldsFirstSync starts the proxy on a state with a file that
// cannot be parsed: what it holds is unknown, so nothing is programmed and
// /readyz says not ready, until the file is fixed.
func TestBrokenFileHoldsFirstSync(t *testing.T) {
	t.Parallel()
	needRoot(t)
	sb := newSandbox(t, []sandbox.Pod{podA, podB})
	state := t.TempDir()
	copyDir(t, exampleState, state)
	writeAtomic(t, state, "broken.yaml", brokenYAML)
	p := launchProxy(t, sb, 5*time.Second, proxyBin, "--proxy-mode=nftables", "--state", state, "--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDRs(), "--iptables-min-sync-period", "100ms", "--iptables-sync-period", "1s",
		"--healthz-bind-address", "127.0.0.1:10256")
	p.waitLog(t, 10*time.Second, "a warning naming broken.yaml", func(lines []string) bool {
		return slices.ContainsFunc(lines, func(l string) bool {
			return isWarningLine(l) && strings.Contains(l, "broken.yaml")
		})
	})
	// Several sync periods pass without a sync (the assertion is that no
	// table appears and /readyz stays 503 throughout).
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		out, err := sb.Exec(t.Context(), sandbox.Node, "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		// Neither the instance lock nor the record of the sysctls set at
		// start is a state programmed.
		ours := strings.ReplaceAll(string(out), "table "+instance.TableFamily.String()+" "+instance.TableName, "")
		ours = strings.ReplaceAll(ours, "table ip "+sysctlrecord.TableName, "")
		if strings.Contains(ours, "kube-nftproxy") || p.syncs() > 0 {
			t.Fatalf("the proxy programmed a state with an unparsable file:\n%s", out)
		}
		resp, err := httpClientIn(sb.NS(sandbox.Node)).Get("http://127.0.0.1:10256/readyz")
		if err != nil {
			t.Fatalf("/readyz: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz answered %d before the first sync, want 503", resp.StatusCode)
		}
		time.Sleep(200 * time.Millisecond) // pacing the samples, not synchronising
	}
	writeAtomic(t, state, "broken.yaml", "# fixed: empty\n")
	p.waitLog(t, 10*time.Second, "the first sync once the file is fixed", func(lines []string) bool {
		return countSyncs(lines) > 0
	})
	p.checkRunning(t)
}

package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/echo"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// The session-affinity Service of these tests: dual-stack, TCP 80 -> 8080,
// NodePort 30060, endpoints pod-a and pod-b, affinity timeout 3 s (short,
// to see it expire).
const (
	stickyIPv4     = "10.96.0.60"
	stickyIPv6     = "fd00:10:96::60"
	stickyNodePort = "30060"
	stickyTimeout  = 3 * time.Second
)

func stickyState(timeoutSeconds int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: %s
  clusterIPs: [%s, "%s"]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: %d}}
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: %s}]
`, stickyIPv4, stickyIPv4, stickyIPv6, timeoutSeconds, stickyNodePort)
	for _, fam := range []string{"IPv4", "IPv6"} {
		fmt.Fprintf(&b, `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: sticky-%s
  namespace: default
  labels: {kubernetes.io/service-name: sticky}
addressType: %s
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
`, strings.ToLower(fam), fam)
		for _, p := range []sandbox.Pod{podA, podB} {
			addr := p.IPv4.String()
			if fam == "IPv6" {
				addr = p.IPv6.String()
			}
			fmt.Fprintf(&b, "- addresses: [\"%s\"]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: %s\n", addr, nodeName)
		}
	}
	return b.String()
}

// clientAddrs gives the external client n more IPv4 addresses (10.99.0.100
// on), so that many distinct clients can be tried.
func clientAddrs(t *testing.T, e *env, n int) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for i := 0; i < n; i++ {
		a := netip.AddrFrom4([4]byte{10, 99, 0, byte(100 + i)})
		if _, err := e.sb.Exec(t.Context(), sandbox.Client, "ip", "addr", "add", a.String()+"/24", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// stickyRequests sends count TCP requests, 100 ms apart, from ns (from
// address src when valid) and returns who answered.
func stickyRequests(t *testing.T, e *env, ns string, src netip.Addr, addr string, count int) *echo.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	args := []string{"--interval", "100ms", "--timeout", "1s", "--until-fail"}
	if src.IsValid() {
		args = append(args, "--src", src.String())
	}
	sum, err := e.client(ctx, ns, "tcp", addr, count, args...)
	if sum == nil || sum.Failed > 0 {
		t.Fatalf("%s (from %v) -> %s: %v %v", ns, src, addr, err, sum)
	}
	return sum
}

// only returns the single backend that answered every request, or fails.
func only(t *testing.T, what string, sum *echo.Summary) string {
	t.Helper()
	if len(sum.Backend) != 1 {
		t.Fatalf("%s: answered by %v; want one endpoint for all (session affinity)", what, sum.Backend)
	}
	for b := range sum.Backend {
		return b
	}
	return ""
}

// sessionAffinity: ClientIP, with real connections: each client keeps its
// endpoint over many connections, whether it uses the ClusterIP or the
// NodePort (upstream keeps one affinity per service port), different
// clients spread over both endpoints, the timer restarts with each
// connection, and the affinity ends once the client is idle for the
// timeout. IPv6 and hairpin traffic on the affinity path too.
func TestSessionAffinity(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{
		pods:  []sandbox.Pod{podA, podB, podC},
		extra: map[string]string{"sticky.yaml": stickyState(int(stickyTimeout / time.Second))},
	})
	clients := clientAddrs(t, e, 16)
	nodePort := hostPort(sandbox.NodeIPv4.Addr().String(), stickyNodePort)
	clusterIP := hostPort(stickyIPv4, "80")

	t.Run("each client sticks, clients spread", func(t *testing.T) {
		seen := map[string]int{}
		for _, c := range clients {
			b := only(t, "NodePort from "+c.String(), stickyRequests(t, e, sandbox.Client, c, nodePort, 5))
			seen[b]++
		}
		if len(seen) != 2 {
			t.Errorf("%d clients all went to %v; want both endpoints used", len(clients), seen)
		}
		t.Logf("clients per endpoint: %v", seen)
	})

	t.Run("ClusterIP and NodePort share the affinity", func(t *testing.T) {
		c := clients[0]
		first := only(t, "NodePort", stickyRequests(t, e, sandbox.Client, c, nodePort, 3))
		if got := only(t, "ClusterIP", stickyRequests(t, e, sandbox.Client, c, clusterIP, 3)); got != first {
			t.Errorf("via the ClusterIP %s, via the NodePort %s: want the same endpoint", got, first)
		}
	})

	t.Run("from a pod, IPv4 and IPv6", func(t *testing.T) {
		only(t, "pod-c to the IPv4 ClusterIP", stickyRequests(t, e, podC.Name, netip.Addr{}, clusterIP, 10))
		only(t, "pod-c to the IPv6 ClusterIP", stickyRequests(t, e, podC.Name, netip.Addr{}, hostPort(stickyIPv6, "80"), 10))
	})

	t.Run("hairpin on the affinity path", func(t *testing.T) {
		sum := stickyRequests(t, e, podA.Name, netip.Addr{}, clusterIP, 10)
		b := only(t, "pod-a to the ClusterIP", sum)
		want := podA.IPv4 // another endpoint sees the pod itself
		if b == podA.Name {
			want = sandbox.BridgeIPv4.Addr() // itself: masqueraded to the node
		}
		if src := sources(sum); len(src) != 1 || src[0] != want {
			t.Errorf("pod-a reaching %s saw sources %v; want %v", b, src, want)
		}
	})

	t.Run("connections restart the timer", func(t *testing.T) {
		// One connection a second for twice the timeout: never idle long
		// enough to lose the endpoint.
		c := clients[1]
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		sum, err := e.client(ctx, sandbox.Client, "tcp", nodePort, int(2*stickyTimeout/time.Second)+1,
			"--interval", "1s", "--timeout", "1s", "--src", c.String())
		if sum == nil || sum.Failed > 0 {
			t.Fatalf("%v %v", err, sum)
		}
		only(t, "one connection a second", sum)
	})

	t.Run("affinity expires", func(t *testing.T) {
		before := map[netip.Addr]string{}
		for _, c := range clients {
			before[c] = only(t, "before", stickyRequests(t, e, sandbox.Client, c, nodePort, 1))
		}
		// Wait (polling the kernel's set, not sleeping) until every
		// client's entry has timed out.
		err := sandbox.Poll(t.Context(), 4*stickyTimeout, 200*time.Millisecond, func(ctx context.Context) error {
			out, err := e.sb.Exec(ctx, sandbox.Node, "nft", "list", "set", "ip", "kube-nftproxy-affinity", "affinity")
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			if strings.Contains(string(out), "elements") {
				return fmt.Errorf("affinity entries left:\n%s", out)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		moved := 0
		for _, c := range clients {
			if only(t, "after", stickyRequests(t, e, sandbox.Client, c, nodePort, 1)) != before[c] {
				moved++
			}
		}
		if moved == 0 {
			t.Errorf("after the timeout, none of %d clients changed endpoint: affinity did not expire", len(clients))
		}
		t.Logf("%d of %d clients changed endpoint after the timeout", moved, len(clients))
	})
}

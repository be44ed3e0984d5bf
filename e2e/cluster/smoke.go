package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"
)

// SmokeResult is what the smoke check saw.
type SmokeResult struct {
	// ViaDNS are the backends that answered the client pod's requests to
	// web.knp-smoke.svc.cluster.local (by pod name).
	ViaDNS []string
	// ViaDNSIPv6 (dual-stack only) are those that answered through
	// web6.knp-smoke, a Service of IPv6 alone: the second family.
	ViaDNSIPv6 []string
	// NodePorts are the first node's NodePort called from the node network
	// on each of its addresses (one per family).
	NodePorts []NodePortResult
}

// NodePortResult is one address's NodePort check: the backends that
// answered (by name) and the client addresses they saw (masqueraded:
// never the requester's).
type NodePortResult struct {
	Addr              string
	Backends, Sources []string
}

// Smoke deploys a backend on each node behind a Service and checks, from
// a client pod on the first node, that the Service's DNS name reaches
// backends on both nodes (in a dual-stack cluster, an IPv6 Service's name
// too); then that the NodePort answers from the node network, on the
// node's address of each family, with the source address masqueraded.
func (l Layout) Smoke(ctx context.Context) (*SmokeResult, error) {
	clientIP, err := l.smokeWorkloads(ctx)
	if err != nil {
		return nil, err
	}
	res := &SmokeResult{}
	want := len(l.Nodes)
	for _, svc := range l.smokeServiceNames() {
		var seen []string
		err = poll(ctx, time.Minute, func() (bool, error) {
			seen, err = l.dialFromPod(ctx, clientIP, svc)
			return err == nil && len(seen) == want, nil
		})
		if svc == "web6" {
			res.ViaDNSIPv6 = seen
		} else {
			res.ViaDNS = seen
		}
		if err != nil {
			return res, fmt.Errorf("client pod -> %s.knp-smoke.svc.%s: saw %v, want %d backends: %w", svc, ClusterDomain, seen, want, err)
		}
	}
	for i, addr := range l.NodeIPs(l.Nodes[0]) {
		np := NodePortResult{Addr: addr}
		err = poll(ctx, time.Minute, func() (bool, error) {
			np.Backends, np.Sources, err = l.nodePortFromNodeNet(ctx, addr)
			return err == nil && len(np.Backends) == want, nil
		})
		res.NodePorts = append(res.NodePorts, np)
		if err != nil {
			return res, fmt.Errorf("NodePort %s from the node network: saw %v: %w", net.JoinHostPort(addr, "30080"), np.Backends, err)
		}
		for _, src := range np.Sources {
			if src == l.BridgeIPs()[i] {
				return res, fmt.Errorf("NodePort traffic reached a backend unmasqueraded (source %s)", src)
			}
		}
	}
	return res, nil
}

// smokeServiceNames are the Services the client pod calls by name: web,
// and in a dual-stack cluster web6 (IPv6 alone).
func (l Layout) smokeServiceNames() []string {
	if l.Family == FamilyDual {
		return []string{"web", "web6"}
	}
	return []string{"web"}
}

// smokeWorkloads applies the smoke check's namespace and workloads, waits
// for their pods, and returns the client pod's address.
func (l Layout) smokeWorkloads(ctx context.Context) (string, error) {
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		return "", err
	}
	agnhost := FindImage(imgs, "agnhost")
	if agnhost == "" {
		return "", fmt.Errorf("images.txt has no agnhost image")
	}
	// Pods are refused until the namespace's default ServiceAccount exists.
	if err := l.apply(ctx, "smoke-namespace", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: knp-smoke\n"); err != nil {
		return "", err
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		_, err := l.kubectl(ctx, "-n", "knp-smoke", "get", "serviceaccount", "default")
		return err == nil, nil
	})
	if err != nil {
		return "", fmt.Errorf("ServiceAccount knp-smoke/default: %w", err)
	}
	if err := l.apply(ctx, "smoke", l.SmokeManifests(agnhost)); err != nil {
		return "", err
	}
	if _, err := l.kubectl(ctx, "-n", "knp-smoke", "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m"); err != nil {
		return "", fmt.Errorf("smoke pods: %w", err)
	}
	return l.kubectl(ctx, "-n", "knp-smoke", "get", "pod", "client", "-o", "jsonpath={.status.podIP}")
}

// dialFromPod asks the client pod's netexec to make 20 HTTP requests to
// Service svc by name (resolved by the pod, through CoreDNS) and returns
// the distinct backends that answered.
func (l Layout) dialFromPod(ctx context.Context, clientIP, svc string) ([]string, error) {
	url := fmt.Sprintf("http://%s/dial?request=hostname&protocol=http&host=%s.knp-smoke.svc.%s&port=80&tries=20",
		net.JoinHostPort(clientIP, "8080"), svc, ClusterDomain)
	out, err := output(ctx, nsenter(l.podProbeNS(), "curl", "-sSg", "--noproxy", "*", "-m", "30", url)...)
	if err != nil {
		return nil, err
	}
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("dial answer %q: %w", out, err)
	}
	return distinct(r.Responses), nil
}

// podProbeNS is where the smoke check reaches pods from: node1's
// namespace, or the node network when the nodes are guests (it routes
// every pod CIDR to its node).
func (l Layout) podProbeNS() string {
	if l.VMNodes() {
		return l.NodeNet
	}
	return l.Nodes[0].Name
}

// nodePortFromNodeNet makes requests from the node network namespace to
// the NodePort on addr: backends by name, and client addresses.
func (l Layout) nodePortFromNodeNet(ctx context.Context, addr string) (backends, sources []string, err error) {
	return l.requestsFromNodeNet(ctx, net.JoinHostPort(addr, "30080"))
}

// requestsFromNodeNet makes 20 requests from the node network namespace
// to an agnhost netexec at hostPort: backends by name, and the client
// addresses they saw.
func (l Layout) requestsFromNodeNet(ctx context.Context, hostPort string) (backends, sources []string, err error) {
	base := "http://" + hostPort
	var names, srcs []string
	for i := 0; i < 20; i++ {
		for path, into := range map[string]*[]string{"/hostname": &names, "/clientip": &srcs} {
			out, err := output(ctx, nsenter(l.NodeNet, "curl", "-sSg", "--noproxy", "*", "-m", "5", base+path)...)
			if err != nil {
				return nil, nil, err
			}
			v := strings.TrimSpace(out)
			if path == "/clientip" {
				if h, _, err := net.SplitHostPort(v); err == nil {
					v = h
				}
			}
			*into = append(*into, v)
		}
	}
	return distinct(names), distinct(srcs), nil
}

func distinct(xs []string) []string {
	set := map[string]bool{}
	for _, x := range xs {
		if x != "" {
			set[x] = true
		}
	}
	out := make([]string, 0, len(set))
	for x := range set {
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

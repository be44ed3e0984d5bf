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
	// NodePortBackends answered requests from the node network to the
	// first node's NodePort; NodePortSources are the client addresses
	// the backends saw (masqueraded: never the requester's).
	NodePortBackends, NodePortSources []string
}

// Smoke deploys a backend on each node behind a Service and checks, from
// a client pod on the first node, that the Service's DNS name reaches
// backends on both nodes; then that the NodePort answers from the node
// network with the source address masqueraded.
func (l Layout) Smoke(ctx context.Context) (*SmokeResult, error) {
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		return nil, err
	}
	agnhost := FindImage(imgs, "agnhost")
	if agnhost == "" {
		return nil, fmt.Errorf("images.txt has no agnhost image")
	}
	// Pods are refused until the namespace's default ServiceAccount exists.
	if err := l.apply(ctx, "smoke-namespace", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: knp-smoke\n"); err != nil {
		return nil, err
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		_, err := l.kubectl(ctx, "-n", "knp-smoke", "get", "serviceaccount", "default")
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ServiceAccount knp-smoke/default: %w", err)
	}
	if err := l.apply(ctx, "smoke", l.SmokeManifests(agnhost)); err != nil {
		return nil, err
	}
	if _, err := l.kubectl(ctx, "-n", "knp-smoke", "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m"); err != nil {
		return nil, fmt.Errorf("smoke pods: %w", err)
	}
	clientIP, err := l.kubectl(ctx, "-n", "knp-smoke", "get", "pod", "client", "-o", "jsonpath={.status.podIP}")
	if err != nil {
		return nil, err
	}
	res := &SmokeResult{}
	want := len(l.Nodes)
	err = poll(ctx, time.Minute, func() (bool, error) {
		res.ViaDNS, err = l.dialFromPod(ctx, clientIP)
		return err == nil && len(res.ViaDNS) == want, nil
	})
	if err != nil {
		return res, fmt.Errorf("client pod -> web.knp-smoke.svc.%s: saw %v, want %d backends: %w", ClusterDomain, res.ViaDNS, want, err)
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		res.NodePortBackends, res.NodePortSources, err = l.nodePortFromNodeNet(ctx)
		return err == nil && len(res.NodePortBackends) == want, nil
	})
	if err != nil {
		return res, fmt.Errorf("NodePort %s:30080 from the node network: saw %v: %w", l.Nodes[0].IP, res.NodePortBackends, err)
	}
	for _, src := range res.NodePortSources {
		if src == BridgeIP {
			return res, fmt.Errorf("NodePort traffic reached a backend unmasqueraded (source %s)", src)
		}
	}
	return res, nil
}

// dialFromPod asks the client pod's netexec to make 20 HTTP requests to
// the Service by name (resolved by the pod, through CoreDNS) and returns
// the distinct backends that answered.
func (l Layout) dialFromPod(ctx context.Context, clientIP string) ([]string, error) {
	url := fmt.Sprintf("http://%s/dial?request=hostname&protocol=http&host=web.knp-smoke.svc.%s&port=80&tries=20",
		net.JoinHostPort(clientIP, "8080"), ClusterDomain)
	out, err := output(ctx, nsenter(l.Nodes[0].Name, "curl", "-sS", "--noproxy", "*", "-m", "30", url)...)
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

// nodePortFromNodeNet makes requests from the node network namespace to
// the first node's NodePort: backends by name, and client addresses.
func (l Layout) nodePortFromNodeNet(ctx context.Context) (backends, sources []string, err error) {
	base := fmt.Sprintf("http://%s:30080", l.Nodes[0].IP)
	var names, srcs []string
	for i := 0; i < 20; i++ {
		for path, into := range map[string]*[]string{"/hostname": &names, "/clientip": &srcs} {
			out, err := output(ctx, nsenter(l.NodeNet, "curl", "-sS", "--noproxy", "*", "-m", "5", base+path)...)
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

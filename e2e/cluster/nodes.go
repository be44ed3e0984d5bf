package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// nodeStatus is one line of `kubectl get nodes`: name, Ready, pod CIDRs.
type nodeStatus struct {
	name, ready string
	podCIDRs    []string
}

func (l Layout) nodeStatuses(ctx context.Context) (map[string]nodeStatus, error) {
	out, err := l.kubectl(ctx, "get", "nodes", "-o",
		`jsonpath={range .items[*]}{.metadata.name}|{.status.conditions[?(@.type=="Ready")].status}|{.spec.podCIDRs[*]}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	return parseNodeStatuses(out), nil
}

// parseNodeStatuses reads nodeStatuses' lines: name|Ready|pod CIDRs
// separated by spaces (either field empty until kubelet reports the
// condition and the controller manager allocates the CIDRs).
func parseNodeStatuses(out string) map[string]nodeStatus {
	st := map[string]nodeStatus{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) == 3 && f[0] != "" {
			st[f[0]] = nodeStatus{name: f[0], ready: f[1], podCIDRs: strings.Fields(f[2])}
		}
	}
	return st
}

// waitPodCIDRs waits until every node has registered and been given a pod
// CIDR of each family by kube-controller-manager.
func (l Layout) waitPodCIDRs(ctx context.Context) (map[string][]string, error) {
	cidrs := map[string][]string{}
	want := len(l.BridgeIPs())
	err := poll(ctx, 3*time.Minute, func() (bool, error) {
		st, _ := l.nodeStatuses(ctx)
		for _, n := range l.Nodes {
			s, ok := st[n.Name]
			if !ok || len(s.podCIDRs) != want {
				return false, nil
			}
			cidrs[n.Name] = s.podCIDRs
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("nodes registered with pod CIDRs: %w (kubelet logs in %s)", err, l.logFile("kubelet-*"))
	}
	return cidrs, nil
}

// setupPodNetwork installs the pod network: flannel when its image and
// CNI plugin exist (and KNP_CLUSTER_CNI is not "bridge"), else the bridge
// plugin on each node with routes to the other nodes' pod CIDRs.
func (l Layout) setupPodNetwork(ctx context.Context, refs imageRefs, cidrs map[string][]string, logf func(string, ...any)) error {
	if err := l.routeNodeNet(ctx, cidrs); err != nil {
		return err
	}
	if l.useFlannel(refs) {
		for _, n := range l.Nodes {
			if err := os.WriteFile(l.nodeFile(n, "cni-net.d/10-flannel.conflist"), []byte(l.FlannelCNIConfig(n)), 0o644); err != nil {
				return err
			}
		}
		logf("pod network: flannel (vxlan, kube subnet manager)")
		return l.apply(ctx, "flannel", FlannelManifests(refs.flannel, l.flannelNetConf()))
	}
	for _, n := range l.Nodes {
		conf, err := l.BridgeCNIConfig(n, cidrs[n.Name])
		if err != nil {
			return err
		}
		if err := os.WriteFile(l.nodeFile(n, "cni-net.d/10-bridge.conflist"), []byte(conf), 0o644); err != nil {
			return err
		}
	}
	logf("pod network: CNI bridge plugin with routes between the nodes")
	return l.routePodCIDRs(ctx, cidrs)
}

func (l Layout) useFlannel(refs imageRefs) bool {
	return refs.flannel != "" && executable(l.CNIBinDir()+"/flannel") && os.Getenv("KNP_CLUSTER_CNI") != "bridge"
}

// deployAddons applies the Service proxy (kube-nftproxy from deploy/ with
// its image and API server address changed, or upstream's kube-proxy) and
// CoreDNS.
func (l Layout) deployAddons(ctx context.Context, deployDir string, refs imageRefs) error {
	proxy, err := l.proxyManifests(ctx, deployDir, refs.proxy)
	if err != nil {
		return err
	}
	if err := l.apply(ctx, l.proxyName(), proxy); err != nil {
		return err
	}
	if l.Proxy == ProxyPrivileged {
		patch, err := filepath.Abs(privilegedPatch(deployDir))
		if err != nil {
			return err
		}
		if _, err := l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", l.proxyName(),
			"--patch-file", patch); err != nil {
			return fmt.Errorf("the privileged variant: %w", err)
		}
	}
	if l.Proxy == ProxyLocalhost {
		if _, err := l.kubectl(ctx, "-n", "kube-system", "patch", "daemonset", l.proxyName(), "--type=json", "-p", localhostArgsPatch); err != nil {
			return fmt.Errorf("the localhost NodePorts variant: %w", err)
		}
	}
	if refs.coredns == "" {
		return nil // Up reports it
	}
	return l.apply(ctx, "coredns", CoreDNSManifests(refs.coredns, l.DNSServiceIPs()))
}

// localhostArgsPatch adds to deploy/'s container the flags of
// ProxyLocalhost.
const localhostArgsPatch = `[{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true"},` +
	`{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--nodeport-addresses=primary,localhost"}]`

// waitNodesReady waits until every node is Ready, printing each as it
// becomes so.
func (l Layout) waitNodesReady(ctx context.Context, logf func(string, ...any)) error {
	seen := map[string]bool{}
	return poll(ctx, 5*time.Minute, func() (bool, error) {
		st, _ := l.nodeStatuses(ctx)
		for _, n := range l.Nodes {
			if st[n.Name].ready == "True" && !seen[n.Name] {
				seen[n.Name] = true
				logf("node %s Ready", n.Name)
			}
		}
		return len(seen) == len(l.Nodes), nil
	})
}

// waitDaemonSet waits until the kube-system DaemonSet's pod runs and is
// ready on every node, printing each as it does.
func (l Layout) waitDaemonSet(ctx context.Context, name string, logf func(string, ...any)) error {
	seen := map[string]bool{}
	err := poll(ctx, l.rolloutTimeout(), func() (bool, error) {
		out, _ := l.kubectl(ctx, "-n", "kube-system", "get", "pods", "-l", podSelector(name), "-o",
			`jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name} {.status.phase} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 4 && f[2] == "Running" && f[3] == "True" && !seen[f[0]] {
				seen[f[0]] = true
				logf("%s pod %s running and ready on %s", name, f[1], f[0])
			}
		}
		return len(seen) == len(l.Nodes), nil
	})
	if err != nil {
		return fmt.Errorf("DaemonSet %s: %w", name, err)
	}
	return nil
}

// waitRollout waits for a workload's rollout.
func (l Layout) waitRollout(ctx context.Context, ns, what string) error {
	_, err := l.kubectl(ctx, "-n", ns, "rollout", "status", what, "--timeout="+l.rolloutTimeout().String())
	return err
}

// rolloutTimeout bounds a rollout: 5 minutes, or 15 on guest nodes, where
// every container start costs the guest's system calls (user-mode Linux
// traps each one) and the first pods wait for one another (flannel reaches
// the API server through the proxy, CoreDNS's sandboxes through flannel).
func (l Layout) rolloutTimeout() time.Duration {
	if l.VMNodes() {
		return 15 * time.Minute
	}
	return 5 * time.Minute
}

package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// The cluster's Service proxy, by KNP_CLUSTER_PROXY.
const (
	ProxyOurs       = "ours"       // kube-nftproxy from deploy/
	ProxyPrivileged = "privileged" // deploy/ patched with deploy/privileged/patch.yaml
	ProxyUpstream   = "upstream"   // kube-proxy v1.37.1, iptables mode: the baseline
	// ProxyUpstreamNFT is the same kube-proxy in nftables mode: the
	// baseline of our nftables mode.
	ProxyUpstreamNFT = "upstream-nftables"
	// ProxyKubeadm is kubeadm's kube-proxy objects as kubeadm writes them
	// (deploy/kubeadm), with only the image changed to ours: the drop-in.
	ProxyKubeadm = "kubeadm"
	// ProxyLocalhost is deploy/ (nftables mode, unprivileged) with
	// kube-proxy's alpha gate for localhost NodePorts on and the NodePort
	// addresses primary,localhost: the userspace proxy (localnodeport).
	ProxyLocalhost = "localhost"
	// ProxyIPVS is deploy/ with --proxy-mode=ipvs in both containers; it
	// and ProxyUpstreamIPVS (kube-proxy v1.37.1 in IPVS mode, its
	// baseline) need a kernel with IPVS: hack/vm/cluster.sh runs the
	// cluster in a VM that has one.
	ProxyIPVS         = "ipvs"
	ProxyUpstreamIPVS = "upstream-ipvs"
)

// checkProxy refuses an unknown KNP_CLUSTER_PROXY before anything starts.
func (l Layout) checkProxy() error {
	switch l.Proxy {
	case "", ProxyOurs, ProxyPrivileged, ProxyUpstream, ProxyUpstreamNFT, ProxyKubeadm, ProxyLocalhost,
		ProxyIPVS, ProxyUpstreamIPVS:
		return nil
	}
	return fmt.Errorf("KNP_CLUSTER_PROXY=%q: want %q, %q, %q, %q, %q, %q, %q or %q", l.Proxy, ProxyOurs, ProxyPrivileged,
		ProxyUpstream, ProxyUpstreamNFT, ProxyKubeadm, ProxyLocalhost, ProxyIPVS, ProxyUpstreamIPVS)
}

// checkKernel refuses an IPVS-mode proxy on a kernel without IPVS
// (procFile is ipvsProcFile) before anything starts, unless the nodes are
// guests (VMNodes).
func (l Layout) checkKernel(procFile string) error {
	if l.Proxy != ProxyIPVS && l.Proxy != ProxyUpstreamIPVS || l.VMNodes() {
		return nil // the guests' kernel has IPVS
	}
	if _, err := os.Stat(procFile); err != nil {
		return fmt.Errorf("KNP_CLUSTER_PROXY=%s needs a kernel with IPVS, and this one has none (%w): KNP_CLUSTER_NODE_KERNEL=$(hack/vm/uml-kernel.sh) makes each node a user-mode Linux guest with IPVS (make cluster and make conformance set it)", l.Proxy, err)
	}
	return nil
}

// ipvsProcFile exists when the kernel has IPVS (in every network namespace).
const ipvsProcFile = "/proc/net/ip_vs"

// isUpstream says whether the proxy is upstream's kube-proxy binary.
func (l Layout) isUpstream() bool {
	return l.Proxy == ProxyUpstream || l.Proxy == ProxyUpstreamNFT || l.Proxy == ProxyUpstreamIPVS
}

// upstreamMode is kube-proxy's mode for an upstream proxy.
func (l Layout) upstreamMode() string {
	switch l.Proxy {
	case ProxyUpstreamNFT:
		return "nftables"
	case ProxyUpstreamIPVS:
		return "ipvs"
	}
	return "iptables"
}

// proxyName is the proxy's DaemonSet name: kubeadm's objects name it
// kube-proxy whatever image it runs.
func (l Layout) proxyName() string {
	if l.isUpstream() || l.Proxy == ProxyKubeadm {
		return "kube-proxy"
	}
	return "kube-nftproxy"
}

// proxyImage is the name of the image the proxy runs.
func (l Layout) proxyImage() string {
	if l.isUpstream() {
		return "kube-proxy"
	}
	return "kube-nftproxy"
}

// podSelector is the label selector of a kube-system DaemonSet's pods: ours
// select on app.kubernetes.io/name (their k8s-app label is kube-proxy's, so
// that what looks for kube-proxy finds them), the others on k8s-app.
func podSelector(daemonSet string) string {
	if daemonSet == "kube-nftproxy" {
		return "app.kubernetes.io/name=kube-nftproxy"
	}
	return "k8s-app=" + daemonSet
}

// privilegedPatch is the file a user applies, with kubectl patch, for the
// privileged variant of deploy/'s DaemonSet.
func privilegedPatch(deployDir string) string {
	return filepath.Join(deployDir, "privileged", "patch.yaml")
}

// proxyManifests are the objects that run the cluster's proxy on every node.
func (l Layout) proxyManifests(ctx context.Context, deployDir, image string) (string, error) {
	if l.Proxy == ProxyKubeadm {
		return KubeadmProxyManifests(deployDir, image, l.APIServerURL(), filepath.Join(l.Dir, "xtables.lock"))
	}
	if l.isUpstream() {
		return UpstreamProxyManifests(image, l.upstreamMode(), l.APIServerURL(), l.ClusterCIDRs(),
			filepath.Join(l.Dir, "xtables.lock")), nil
	}
	dir := deployDir
	if l.Proxy == ProxyIPVS {
		dir = filepath.Join(deployDir, "ipvs") // the overlay users apply
	}
	m, err := DeployManifests(ctx, l.KubectlBin(), dir, image, l.APIServerURL())
	if err != nil || l.ClusterCIDRs() == ClusterCIDR {
		return m, err
	}
	// deploy/ says to set --cluster-cidr to one's pod ranges: one per family.
	return replaceOnce(m, "deploy manifests", []struct{ old, new string }{
		{"--cluster-cidr=" + ClusterCIDR + "\n", "--cluster-cidr=" + l.ClusterCIDRs() + "\n"},
	})
}

// UpstreamProxyManifests run kube-proxy as kubeadm deploys it: ServiceAccount
// kube-proxy bound to system:node-proxier, a ConfigMap with the
// KubeProxyConfiguration and a kubeconfig naming the API server directly, and
// a privileged hostNetwork DaemonSet labelled k8s-app=kube-proxy (the label
// e2e's "restarting kube-proxy" spec looks for) mounting /run/xtables.lock
// and /lib/modules, in mode (iptables or nftables). conntrack.maxPerCore 0 leaves
// nf_conntrack_max alone: it is machine-wide, not the node namespace's. The
// xtables lock is xtablesLock, a file under the cluster's state directory
// (not the host's /run/xtables.lock), so Down leaves nothing behind.
// clusterCIDRs are the pod ranges (Layout.ClusterCIDRs).
func UpstreamProxyManifests(image, mode, apiServer, clusterCIDRs, xtablesLock string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    app: kube-proxy
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    bindAddress: 0.0.0.0
    clientConnection:
      kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
    clusterCIDR: %[3]s
    mode: %[5]s
    conntrack:
      maxPerCore: 0
  kubeconfig.conf: |
    apiVersion: v1
    kind: Config
    clusters:
    - name: default
      cluster:
        server: %[2]s
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    contexts:
    - name: default
      context:
        cluster: default
        namespace: default
        user: default
    current-context: default
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels:
    k8s-app: kube-proxy
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      serviceAccountName: kube-proxy
      priorityClassName: system-node-critical
      hostNetwork: true
      tolerations:
      - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
      containers:
      - name: kube-proxy
        image: %[1]s
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        securityContext:
          privileged: true
        volumeMounts:
        - name: kube-proxy
          mountPath: /var/lib/kube-proxy
        - name: xtables-lock
          mountPath: /run/xtables.lock
        - name: lib-modules
          mountPath: /lib/modules
          readOnly: true
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: %[4]s
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
`, image, apiServer, clusterCIDRs, xtablesLock, mode)
}

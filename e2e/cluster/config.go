package cluster

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// runcPath is Debian's runc (the contract builds none).
func runcPath() string {
	if p, err := exec.LookPath("runc"); err == nil {
		return p
	}
	return "/usr/sbin/runc"
}

func (l Layout) nodeFile(n Node, name string) string { return filepath.Join(l.NodeDir(n), name) }

// kubeconfig is a kubeconfig for a client certificate pki/<certFile>.crt.
func (l Layout) kubeconfig(server, certFile string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: knp-cluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: %s
  context:
    cluster: knp-cluster
    user: %s
current-context: %s
`, server, l.pki("ca.crt"), certFile, l.pki(certFile+".crt"), l.pki(certFile+".key"),
		certFile, certFile, certFile)
}

// KubeletConfig is the node's KubeletConfiguration. Each kubelet has its
// own cgroup root (/<node> in every hierarchy), pod log directory (two
// kubelets sharing /var/log/pods delete each other's logs) and resolv.conf
// (pointing inside the namespaces, so no lookup leaves them).
func (l Layout) KubeletConfig(n Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: /%s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
clusterDNS:
- %q
clusterDomain: %s
resolvConf: %s
podLogsDir: %s
address: %q
healthzBindAddress: 127.0.0.1
rotateCertificates: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
maxPods: 110
`, l.pki("ca.crt"), n.Name, l.ContainerdSocket(n), l.DNSServiceIPs()[0], ClusterDomain,
		l.resolvConf(n), l.podLogsDir(n), l.kubeletAddress(n))
}

// kubeletAddress is where kubelet serves: the node's IPv4 address on an
// IPv4 cluster (as ever), else every address of both families.
func (l Layout) kubeletAddress(n Node) string {
	if l.HasIPv6() {
		return l.wildcard()
	}
	return n.IP
}

// KubeletArgs are the node's kubelet flags (what the configuration file
// cannot say).
func (l Layout) KubeletArgs(n Node) []string {
	return append([]string{
		"--config=" + l.nodeFile(n, "kubelet.yaml"),
		"--kubeconfig=" + l.kubeconfigFor("kubelet-"+n.Name),
		"--root-dir=" + l.kubeletRoot(n),
		"--node-ip=" + strings.Join(l.NodeIPs(n), ","),
		"--hostname-override=" + n.Name,
		"--v=1",
	}, nodeLabelArgs(n)...)
}

// ContainerdConfig is the node's containerd configuration: its own root,
// state and socket; CRI with overlayfs, runc through cgroupfs, the
// cluster's pause image, oom_score_adj restricted (runc cannot raise it
// without CAP_SYS_RESOURCE), the node's CNI directories, and the pods'
// network namespaces mounted under the state directory (not /run/netns)
// so teardown finds them. major is containerd's major version: 1 reads
// configuration version 2, 2 and later version 3.
func (l Layout) ContainerdConfig(n Node, major int) string {
	if major >= 2 {
		return l.containerdConfigV3(n)
	}
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, l.containerdRoot(n), l.ContainerdState(n), l.ContainerdSocket(n), l.nodeFile(n, "opt"),
		PauseImage, runcPath(), l.CNIBinDir(), l.cniConfDir(n))
}

func (l Layout) containerdConfigV3(n Node) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.blockfile"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

# Both nodes' containerds would bind the one NRI socket, /var/run/nri/nri.sock.
[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, l.containerdRoot(n), l.ContainerdState(n), l.ContainerdSocket(n), l.nodeFile(n, "opt"),
		PauseImage, runcPath(), l.CNIBinDir(), l.cniConfDir(n))
}

// BridgeCNIConfig is the fallback pod network of a node (no flannel): the
// bridge plugin on cni0 with host-local addresses from the node's pod
// CIDRs, one range and default route per family (a network name per node,
// so the two nodes' host-local stores under /var/lib/cni/networks stay
// apart), and portmap.
func (l Layout) BridgeCNIConfig(n Node, podCIDRs []string) (string, error) {
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, c := range podCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": c}})
		dst := "0.0.0.0/0"
		if isIPv6(c) {
			dst = "::/0"
		}
		routes = append(routes, map[string]string{"dst": dst})
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "knp-" + n.Name,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": ranges,
					"routes": routes,
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	return string(b) + "\n", err
}

// FlannelCNIConfig is a node's CNI configuration for flannel: the flannel
// plugin reading the subnet file that node's flanneld writes (the two
// nodes share one file system, so each has its own), delegating to the
// bridge plugin with hairpin mode and no masquerading (the plugin would
// otherwise masquerade pod traffic with iptables, since flanneld runs
// with --ip-masq=false), and portmap.
func (l Layout) FlannelCNIConfig(n Node) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.3.1",
  "name": "cbr0-%s",
  "plugins": [
    {
      "type": "flannel",
      "subnetFile": %q,
      "dataDir": %q,
      "delegate": {"hairpinMode": true, "isDefaultGateway": true, "ipMasq": false}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.Name, FlannelSubnetFile(n), "/var/lib/cni/flannel/"+n.Name)
}

// FlannelSubnetFile is where node n's flanneld writes its subnet.env.
func FlannelSubnetFile(n Node) string { return "/run/flannel/" + n.Name + "/subnet.env" }

// resolvConfText names the node network's gateway as the only name
// server: nothing answers there, and no query can leave the namespaces.
func (l Layout) resolvConfText() string {
	return "nameserver " + l.BridgeIPs()[0] + "\noptions ndots:1 timeout:1 attempts:1\n"
}

// controlPlaneArgs are the flags of etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, by name.
func (l Layout) controlPlaneArgs(etcdBin string) map[string][]string {
	return map[string][]string{
		"etcd": {etcdBin,
			"--name=knp-cluster", "--data-dir=" + l.Dir + "/etcd",
			fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdClientPort),
			fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", etcdClientPort),
			fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
			fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
			fmt.Sprintf("--initial-cluster=knp-cluster=http://127.0.0.1:%d", etcdPeerPort),
			"--logger=zap", "--log-outputs=stderr", "--quota-backend-bytes=2147483648"},
		"kube-apiserver": {l.K8sBin("kube-apiserver"),
			fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClientPort),
			"--advertise-address=" + l.BridgeIPs()[0], "--bind-address=" + l.wildcard(),
			fmt.Sprintf("--secure-port=%d", APIServerPort),
			"--cert-dir=" + l.Dir + "/apiserver-certs",
			"--tls-cert-file=" + l.pki("apiserver.crt"), "--tls-private-key-file=" + l.pki("apiserver.key"),
			"--client-ca-file=" + l.pki("ca.crt"),
			"--kubelet-client-certificate=" + l.pki("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + l.pki("apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			"--service-account-issuer=https://kubernetes.default.svc." + ClusterDomain,
			"--service-account-key-file=" + l.pki("sa.pub"),
			"--service-account-signing-key-file=" + l.pki("sa.key"),
			"--service-cluster-ip-range=" + l.ServiceCIDRs(),
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true", "--profiling=false", "--v=1"},
		"kube-controller-manager": append(append([]string{l.K8sBin("kube-controller-manager"),
			"--kubeconfig=" + l.kubeconfigFor("kube-controller-manager"),
			"--authentication-kubeconfig=" + l.kubeconfigFor("kube-controller-manager"),
			"--authorization-kubeconfig=" + l.kubeconfigFor("kube-controller-manager"),
			"--bind-address=127.0.0.1", "--leader-elect=false",
			"--allocate-node-cidrs", "--cluster-cidr=" + l.ClusterCIDRs()},
			l.nodeCIDRMaskArgs()...),
			"--service-cluster-ip-range="+l.ServiceCIDRs(),
			"--service-account-private-key-file="+l.pki("sa.key"),
			"--root-ca-file="+l.pki("ca.crt"),
			"--cluster-signing-cert-file="+l.pki("ca.crt"), "--cluster-signing-key-file="+l.pki("ca.key"),
			"--use-service-account-credentials=true", "--controllers=*",
			"--profiling=false", "--v=1"),
		"kube-scheduler": {l.K8sBin("kube-scheduler"),
			"--kubeconfig=" + l.kubeconfigFor("kube-scheduler"),
			"--authentication-kubeconfig=" + l.kubeconfigFor("kube-scheduler"),
			"--authorization-kubeconfig=" + l.kubeconfigFor("kube-scheduler"),
			"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1"},
	}
}

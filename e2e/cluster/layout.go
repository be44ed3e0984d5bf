// Package cluster brings up a real Kubernetes cluster (two nodes unless
// KNP_CLUSTER_NODES says otherwise) on this one
// machine, with kube-nftproxy as its only service proxy, and tears it down.
//
// Topology (every address lives in network namespaces the package creates;
// the host's root namespace is never changed):
//
//	netns "nodenet" (Layout.NodeNet): bridge br0 10.200.0.1/24 (the node network) and the
//	    control plane: etcd, kube-apiserver (https://10.200.0.1:6443),
//	    kube-controller-manager, kube-scheduler.
//	netns "node1", "node2": eth0 10.200.0.11/24, 10.200.0.12/24 (veth peers
//	    enslaved to br0), each with its own containerd and kubelet.
//
// KNP_CLUSTER_NODES=3 (up to 6) adds node3 (10.200.0.13) and on, and puts
// the nodes in zones zone-a, zone-b, zone-c in turn (shape.go).
//
// KNP_CLUSTER_FAMILY=dual adds fd00:200::1/64 to br0 and fd00:200::11, ::12
// to the nodes, a second Service range (fd00:10:96::/112) and pod range
// (fd00:10:244::/56); =ipv6 has those alone (the API server at
// https://[fd00:200::1]:6443). See family.go.
//
// KNP_CLUSTER_LB=metallb adds MetalLB in L2 mode, handing type=LoadBalancer
// Services addresses from 10.200.0.200-239 (and fd00:200::200-239) on the
// node network. See metallb.go.
//
// The binaries come from the cluster build contract under $KNP_CACHE
// (hack/cluster/build.sh), the images from $KNP_CACHE/cluster/images
// (hack/cluster/images.sh). All state lives under Layout.Dir
// (/var/lib/knp-cluster) and /run/containerd-<node>.
//
// The pod network is flannel (vxlan, kube subnet manager) when its image
// and CNI plugin exist, else (or with KNP_CLUSTER_CNI=bridge) the CNI
// bridge plugin with routes between the nodes. kube-nftproxy comes from
// deploy/ with only its image and API server address changed, or with
// KNP_CLUSTER_PROXY=upstream kube-proxy v1.37.1 in iptables mode as kubeadm
// deploys it (the conformance baseline); CoreDNS as kubeadm deploys it.
//
// Usage (root, from the repository root): make cluster, make
// cluster-status, make cluster-down; hack/cluster/kubectl.sh and
// hack/cluster/e2e.sh run kubectl and the upstream e2e.test inside the node
// network. Down removes processes, mounts, namespaces, cgroups,
// directories, and puts back the machine-wide sysctls kubelet changed.
package cluster

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// Kubernetes addressing, matching e2e/TOPOLOGY.md where it overlaps.
const (
	ServiceCIDR    = "10.96.0.0/16"
	ClusterCIDR    = "10.244.0.0/16"
	DNSServiceIP   = "10.96.0.10"
	KubernetesIP   = "10.96.0.1"
	ClusterDomain  = "cluster.local"
	BridgeName     = "br0"
	BridgeIP       = "10.200.0.1"
	NodeNetPrefix  = 24
	APIServerPort  = 6443
	K8sVersion     = "v1.37.1"
	PauseImage     = "registry.k8s.io/pause:3.10.2"
	defaultDir     = "/var/lib/knp-cluster"
	defaultCache   = "/var/cache/kube-nftproxy"
	containerdRun  = "/run/containerd-"
	etcdClientPort = 2379
	etcdPeerPort   = 2380
)

// Node is one kubelet + containerd in its own network namespace.
type Node struct {
	Name string // node name, network namespace and cgroup root (/Name)
	IP   string // eth0's IPv4 address on the node network
	IP6  string // eth0's IPv6 address on the node network (dual, ipv6)
	Zone string // topology.kubernetes.io/zone, empty for none
}

// Layout says where everything lives.
type Layout struct {
	NodeNet string // the node network's namespace, home of the control plane
	Dir     string // state: certificates, configs, data, logs, pid files
	Cache   string // $KNP_CACHE: binaries and images
	Nodes   []Node
	// Proxy is the cluster's Service proxy: ProxyOurs (kube-nftproxy from
	// deploy/, the default) or another of the Proxy* constants
	// (upstream_proxy.go); KNP_CLUSTER_PROXY sets it.
	Proxy string
	// Images, when set, is the directory of images.txt and the archives in
	// place of the cache's (a test that builds its own proxy image).
	Images string
	// Family is the cluster's IP families: FamilyIPv4 (the default, also
	// when empty), FamilyDual or FamilyIPv6; KNP_CLUSTER_FAMILY sets it.
	Family string
	// NodesErr is why KNP_CLUSTER_NODES was refused (Up returns it).
	NodesErr error
	// LB is the load balancer: LBNone (the default) or LBMetalLB;
	// KNP_CLUSTER_LB sets it (metallb.go).
	LB string
	// NodeKernel, when set, is a user-mode Linux kernel: each node is a
	// guest running it (vmnode.go); KNP_CLUSTER_NODE_KERNEL sets it.
	NodeKernel string
	// GuestImages is which images a guest node imports before its kubelet
	// starts: GuestImagesAll (the default) or GuestImagesCore (vmnode.go);
	// KNP_CLUSTER_GUEST_IMAGES sets it.
	GuestImages string
}

// DefaultLayout is the cluster `make cluster` brings up: KNP_CACHE and
// KNP_CLUSTER_DIR override the cache and state directories, KNP_CLUSTER_IMAGES
// the images directory, KNP_CLUSTER_FAMILY the IP families,
// KNP_CLUSTER_NODES the number of nodes (see makeNodes; a bad value leaves
// Nodes empty, which Up refuses with NodesErr's reason).
func DefaultLayout() Layout {
	l := Layout{NodeNet: "nodenet", Dir: defaultDir, Cache: defaultCache}
	count, err := parseNodeCount(os.Getenv("KNP_CLUSTER_NODES"))
	if err != nil {
		l.NodesErr = err
	} else {
		l.Nodes = makeNodes(count)
	}
	if v := os.Getenv("KNP_CACHE"); v != "" {
		l.Cache = v
	}
	if v := os.Getenv("KNP_CLUSTER_DIR"); v != "" {
		l.Dir = v
	}
	// KNP_CLUSTER_IMAGES: an images directory of one's own (a proxy image
	// built from a work tree), in place of the cache's.
	l.Images = os.Getenv("KNP_CLUSTER_IMAGES")
	l.Proxy = ProxyOurs
	if v := os.Getenv("KNP_CLUSTER_PROXY"); v != "" {
		l.Proxy = v
	}
	l.Family = FamilyIPv4
	if v := os.Getenv("KNP_CLUSTER_FAMILY"); v != "" {
		l.Family = v
	}
	l.LB = os.Getenv("KNP_CLUSTER_LB")
	l.NodeKernel = os.Getenv(nodeKernelEnv)
	l.GuestImages = os.Getenv(guestImagesEnv)
	return l
}

// APIServerURL is the API server's address on the node network (of the
// primary family).
func (l Layout) APIServerURL() string {
	return "https://" + net.JoinHostPort(l.BridgeIPs()[0], strconv.Itoa(APIServerPort))
}

// K8sBin is a Kubernetes binary from hack/cluster/build.sh.
func (l Layout) K8sBin(name string) string {
	return filepath.Join(l.Cache, "k8s-"+K8sVersion, "bin", name)
}

// ClusterBin is a non-Kubernetes binary (etcd, containerd, ...).
func (l Layout) ClusterBin(name string) string {
	return filepath.Join(l.Cache, "cluster", "bin", name)
}

// ImagesDir holds the docker archives and images.txt.
func (l Layout) ImagesDir() string {
	if l.Images != "" {
		return l.Images
	}
	return filepath.Join(l.Cache, "cluster", "images")
}

func (l Layout) pki(name string) string     { return filepath.Join(l.Dir, "pki", name) }
func (l Layout) logsDir() string            { return filepath.Join(l.Dir, "logs") }
func (l Layout) logFile(name string) string { return filepath.Join(l.logsDir(), name+".log") }
func (l Layout) pidFile(name string) string { return filepath.Join(l.Dir, "pids", name+".pid") }

// Kubeconfig is the admin kubeconfig (user "admin", group system:masters).
func (l Layout) Kubeconfig() string { return filepath.Join(l.Dir, "admin.kubeconfig") }

func (l Layout) kubeconfigFor(user string) string {
	return filepath.Join(l.Dir, user+".kubeconfig")
}

// NodeDir is the node's own directory: containerd root, kubelet root, pod
// logs, CNI configuration, resolv.conf.
func (l Layout) NodeDir(n Node) string { return filepath.Join(l.Dir, n.Name) }

// ContainerdState is the node's containerd state directory (its socket,
// shim bundles, CRI network namespace mounts).
func (l Layout) ContainerdState(n Node) string { return containerdRun + n.Name }

// ContainerdSocket is the node's CRI endpoint.
func (l Layout) ContainerdSocket(n Node) string {
	return filepath.Join(l.ContainerdState(n), "containerd.sock")
}

func (l Layout) kubeletRoot(n Node) string { return filepath.Join(l.NodeDir(n), "kubelet") }
func (l Layout) cniConfDir(n Node) string  { return filepath.Join(l.NodeDir(n), "cni-net.d") }
func (l Layout) resolvConf(n Node) string  { return filepath.Join(l.NodeDir(n), "resolv.conf") }
func (l Layout) podLogsDir(n Node) string  { return filepath.Join(l.NodeDir(n), "pod-logs") }
func (l Layout) containerdRoot(n Node) string {
	return filepath.Join(l.NodeDir(n), "containerd")
}

// CNIBinDir is where containerd finds the CNI plugins: the contract's
// cluster/bin/cni, else Debian's containernetworking-plugins.
func (l Layout) CNIBinDir() string {
	d := filepath.Join(l.Cache, "cluster", "bin", "cni")
	if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
		return d
	}
	return "/usr/lib/cni"
}

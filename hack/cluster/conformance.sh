#!/bin/sh
# Runs upstream's e2e.test v1.37.1 against the two-node cluster (make cluster)
# on the Service proxy's part of the suite, and writes a JUnit report.
#
#   hack/cluster/conformance.sh            # PROXY=ours: kube-nftproxy from deploy/
#   PROXY=privileged hack/cluster/conformance.sh # deploy/ + deploy/privileged/patch.yaml
#   PROXY=upstream hack/cluster/conformance.sh   # kube-proxy v1.37.1, iptables mode
#   PROXY=upstream-nftables hack/cluster/conformance.sh # kube-proxy v1.37.1, nftables mode
#   PROXY=kubeadm hack/cluster/conformance.sh    # upstream's objects, our image
#   PROXY=localhost hack/cluster/conformance.sh  # deploy/ + KubeProxyNFTablesLocalhostNodePorts, primary,localhost
#   PROXY=ipvs hack/cluster/conformance.sh       # deploy/ in IPVS mode (a kernel with IPVS: hack/vm/cluster.sh)
#   PROXY=upstream-ipvs hack/cluster/conformance.sh # kube-proxy v1.37.1, IPVS mode (the same)
#   hack/cluster/conformance.sh --list     # print the selection, run nothing
#   KNP_CLUSTER_FAMILY=dual hack/cluster/conformance.sh # on a dual-stack cluster
#   KNP_CLUSTER_NODES=3 hack/cluster/conformance.sh # three nodes in three zones
#   KNP_CLUSTER_LB=metallb hack/cluster/conformance.sh  # with MetalLB: [Feature:LoadBalancer] runs
#
# It brings the cluster up with that proxy if none is up (KNP_CLUSTER_PROXY),
# and refuses to run on a cluster that runs the other proxy. The cluster stays
# up afterwards (make cluster-down). Environment:
#   PROXY                ours (default), privileged, upstream, upstream-nftables,
#                        kubeadm, localhost, ipvs or upstream-ipvs
#   KNP_CLUSTER_FAMILY   ipv4 (default), dual or ipv6: the cluster's IP families
#                        (dual adds every [Feature:IPv6DualStack] sig-network spec)
#   KNP_CLUSTER_NODES    2 (default) to 6; three or more spread over three zones
#   KNP_CLUSTER_CNI      flannel (default) or bridge: the pod network
#   CONFORMANCE_PROCS    parallel ginkgo processes (default 4; [Serial] specs
#                        run alone at the end); 1 runs e2e.test by itself
#   CONFORMANCE_FOCUS    replaces the focus regular expression below
#   CONFORMANCE_SKIP     replaces the skip regular expression below
#   KNP_CLUSTER_LB       metallb: the cluster has MetalLB (L2 mode), so the
#                        [Feature:LoadBalancer] specs run (unset: skipped)
#   KNP_CLUSTER_CMD      the cluster command (default: go run ./e2e/cluster/cmd;
#                        hack/vm/cluster.sh gives a binary built on the host)
#   CONFORMANCE_OUT      report directory (default bin/conformance/$PROXY, with
#                        -$KNP_CLUSTER_FAMILY but for ipv4, -<N>nodes but for 2,
#                        -bridge for that CNI, -metallb with KNP_CLUSTER_LB=metallb)
# Prints ginkgo's summary and the JUnit counts (ran / passed / failed / skipped).
set -eu
cd "$(dirname "$0")/../.."
cache=${KNP_CACHE:-/var/cache/kube-nftproxy}
dir=${KNP_CLUSTER_DIR:-/var/lib/knp-cluster}
proxy=${PROXY:-ours}
procs=${CONFORMANCE_PROCS:-4}
family=${KNP_CLUSTER_FAMILY:-ipv4}
nodes=${KNP_CLUSTER_NODES:-2}
cni=${KNP_CLUSTER_CNI:-flannel}
case $family in
ipv4) shape= ;;
dual | ipv6) shape=-$family ;;
*) echo "conformance.sh: KNP_CLUSTER_FAMILY must be ipv4, dual or ipv6, not $family" >&2; exit 2 ;;
esac
case $nodes in
2) ;;
[3-6]) shape=$shape-${nodes}nodes ;;
*) echo "conformance.sh: KNP_CLUSTER_NODES must be 2 to 6, not $nodes" >&2; exit 2 ;;
esac
case $cni in
flannel) ;;
bridge) shape=$shape-bridge ;;
*) echo "conformance.sh: KNP_CLUSTER_CNI must be flannel or bridge, not $cni" >&2; exit 2 ;;
esac
lb=${KNP_CLUSTER_LB:-}
case $lb in
'') ;;
metallb) shape=$shape-metallb ;;
*) echo "conformance.sh: KNP_CLUSTER_LB must be metallb or unset, not $lb" >&2; exit 2 ;;
esac
out=${CONFORMANCE_OUT:-bin/conformance/$proxy$shape}
e2e=$cache/k8s-v1.37.1/bin/e2e.test

case $proxy in
ours | privileged | localhost | ipvs) ds=kube-nftproxy ;;
upstream | upstream-nftables | upstream-ipvs | kubeadm) ds=kube-proxy ;;
*) echo "conformance.sh: PROXY must be ours, privileged, upstream, upstream-nftables, kubeadm, localhost, ipvs or upstream-ipvs, not $proxy" >&2; exit 2 ;;
esac
cluster_cmd=${KNP_CLUSTER_CMD:-go run ./e2e/cluster/cmd}

# The selection: all of "[sig-network] Services" (Conformance or not, Serial
# and Disruptive included), every sig-network [Conformance] spec, and the
# other proxy specs: Networking Granular Checks (pod/node/endpoint -> Service,
# session affinity, NodePort, hostNetwork endpoints), Conntrack, KubeProxy,
# LocalhostNodePorts, LoadBalancers (skipped below: kept so the list says why),
# Traffic Distribution and Topology Hints (they skip themselves on fewer than
# three zones; the two "between pods on multiple nodes" specs need three zones
# of two nodes: KNP_CLUSTER_NODES=6).
# On a dual-stack cluster (KNP_CLUSTER_FAMILY=dual) every sig-network
# [Feature:IPv6DualStack] spec too: the second family's Granular Checks
# (pod/node/endpoint -> the Service's secondary ClusterIP, session affinity,
# hostNetwork endpoints) and the dual-stack Service, pod and node checks (23,
# one of them SCTP). On IPv4 or IPv6 single-stack they cannot run. 141 specs
# match the focus, 115 remain (on a kernel without SCTP); dual-stack: 164, 137.
focus='\[sig-network\] (Services |Networking Granular Checks|Conntrack |KubeProxy |LocalhostNodePorts |LoadBalancers |Traffic Distribution |Topology Hints )|\[sig-network\] .*\[Conformance\]'
if [ "$family" = dual ]; then
	focus="$focus"'|\[sig-network\] \[Feature:IPv6DualStack\]'
fi
focus=${CONFORMANCE_FOCUS:-$focus}

# What cannot run here, each with its reason. Specs the suite skips itself
# are not listed: "should work after restarting apiserver [Disruptive]" (the
# API server is not a pod), specs needing zones, three nodes or a cloud
# provider (they say so in their skip message).
skips=
skip() { skips=${skips:+$skips|}$1; }
# Load balancers: without KNP_CLUSTER_LB=metallb nothing hands a
# type=LoadBalancer Service an ingress address (provider "skeleton" has no
# load-balancer controller). With MetalLB (L2 mode) they run, but for one:
# "should handle load balancer cleanup finalizer" waits for the finalizer
# service.kubernetes.io/load-balancer-cleanup, which the cloud provider's
# service controller adds; MetalLB never does, so it fails after 15 minutes
# whatever the proxy (kube-proxy v1.37.1 too: docs/cluster.md). Bound to
# where MetalLB announces: "should be able to switch session affinity ...
# with Local traffic policy" expects requests from outside to spread over
# endpoints; in L2 mode one node attracts an address's traffic, and with
# Local only its own endpoints answer, so it fails when that node holds one
# of the spec's three pods (docs/cluster.md, the dual-stack row). On two
# nodes that depends on placement, so it runs; on three or more the
# scheduler spreads the pods one per node, so it always would: skipped.
if [ "$lb" = metallb ]; then
	skip 'LoadBalancers .* should handle load balancer cleanup finalizer for service'
	if [ "$nodes" -ge 3 ]; then
		skip 'LoadBalancers .* should be able to switch session affinity for LoadBalancer service with Local traffic policy'
	fi
else
	skip '\[Feature:LoadBalancer\]'
fi
# Feature-gated or optional proxy behaviour not enabled in this cluster:
# NFAcct metrics need the nfnetlink_acct counters kube-proxy's iptables mode
# reads; localhost NodePorts (route_localnet) are iptables-mode only: deploy/
# runs nftables mode, which serves none, as upstream's. kubeadm's objects
# (PROXY=upstream, PROXY=kubeadm) run iptables mode privileged, and
# PROXY=localhost nftables mode with kube-proxy's alpha gate for them (a
# userspace proxy): they run them. kube-proxy's nftables mode
# (PROXY=upstream-nftables) serves none either, nor does IPVS mode (its NodePort
# virtual servers are on every local address but loopback), ours or upstream's.
skip '\[Feature:KubeProxyNFAcct\]'
# On IPv6 single-stack the LocalhostNodePorts specs call [::1]:NodePort, which
# iptables mode never serves (route_localnet has no IPv6 counterpart: kube-proxy
# v1.37.1 failed all three there, timing out), so they are skipped for every proxy.
case $proxy/$family in
ours/* | privileged/* | upstream-nftables/* | ipvs/* | upstream-ipvs/* | */ipv6) skip '\[Feature:LocalhostNodePorts\]' ;;
esac
# "should implement NodePort and HealthCheckNodePort correctly when
# ExternalTrafficPolicy changes" (three nodes) curls a node's own NodePort from
# that node with eTP=Local and expects the backend on another node to see the
# node's IP. Every proxy masquerades such node-local traffic (kube-proxy's "route
# LOCAL traffic" rule), and with flannel the masquerade takes flannel.1's address
# (the route to the other node's pods), not the node IP: kube-proxy v1.37.1 fails
# it there exactly as we would. The bridge CNI (KNP_CLUSTER_CNI=bridge) routes
# pods through the node IPs, as kind's kindnet does, and runs it.
if [ "$nodes" -ge 3 ] && [ "$cni" = flannel ]; then
	skip 'should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes'
fi
# SCTP traffic: only when the kernel has the protocol (this machine's kernel
# has no sctp and no modules to load, so the SCTP connectivity specs would
# time out). "should allow creating a basic SCTP service [Serial]" runs: it
# sends no SCTP, only checks the endpoints and that no sctp module got loaded.
if [ ! -e /proc/net/sctp ]; then
	skip '\[Feature:SCTPConnectivity\]'
fi
skip=${CONFORMANCE_SKIP:-$skips}

if [ "${1:-}" = --list ]; then
	echo "focus: $focus"
	echo "skip:  $skip"
	"$e2e" --list-tests | sed -n 's/^ *k8s.io[^:]*:[0-9]*: //p' |
		grep -E -- "$focus" | grep -v -E -- "$skip"
	exit 0
fi

# ginkgo CLI (parallel runs), built once into the cache by build.sh.
ginkgo=$cache/cluster/bin/ginkgo
if [ "$procs" -gt 1 ]; then
	hack/cluster/build.sh ginkgo >&2
fi

kubectl() { nsenter --net=/run/netns/nodenet -- "$cache/k8s-v1.37.1/bin/kubectl" --kubeconfig="$dir/admin.kubeconfig" "$@"; }
# cluster_family says which families node1's InternalIPs are of.
cluster_family() {
	ips=$(kubectl get node node1 -o 'jsonpath={.status.addresses[?(@.type=="InternalIP")].address}')
	case $ips in
	*.*:* | *:*.*) echo dual ;;
	*:*) echo ipv6 ;;
	*) echo ipv4 ;;
	esac
}
if [ -d "$dir" ]; then
	up_lb=
	if kubectl get namespace metallb-system >/dev/null 2>&1; then up_lb=metallb; fi
	if [ "$up_lb" != "$lb" ]; then
		echo "conformance.sh: the cluster that is up has KNP_CLUSTER_LB=${up_lb:-(unset)}, not ${lb:-(unset)}: make cluster-down first" >&2
		exit 1
	fi
	up_family=$(cluster_family)
	if [ "$up_family" != "$family" ]; then
		echo "conformance.sh: the cluster that is up is $up_family, KNP_CLUSTER_FAMILY=$family: make cluster-down first" >&2
		exit 1
	fi
	up_cni=bridge
	kubectl -n kube-system get daemonset kube-flannel >/dev/null 2>&1 && up_cni=flannel
	if [ "$up_cni" != "$cni" ]; then
		echo "conformance.sh: the cluster that is up runs $up_cni, KNP_CLUSTER_CNI=$cni: make cluster-down first" >&2
		exit 1
	fi
	up_nodes=$(kubectl get nodes -o name | wc -l)
	if [ "$up_nodes" != "$nodes" ]; then
		echo "conformance.sh: the cluster that is up has $up_nodes nodes, KNP_CLUSTER_NODES=$nodes: make cluster-down first" >&2
		exit 1
	fi
	if ! kubectl -n kube-system get daemonset "$ds" >/dev/null 2>&1; then
		echo "conformance.sh: the cluster that is up has no DaemonSet $ds (PROXY=$proxy): make cluster-down first" >&2
		exit 1
	fi
	image=$(kubectl -n kube-system get daemonset "$ds" -o 'jsonpath={.spec.template.spec.containers[0].image}')
	case $proxy/$image in
	upstream*/*kube-nftproxy* | kubeadm/*kube-proxy:*)
		echo "conformance.sh: the DaemonSet $ds that is up runs $image, PROXY=$proxy: make cluster-down first" >&2
		exit 1
		;;
	esac
	case $proxy in
	upstream | upstream-nftables | upstream-ipvs | ipvs | ours)
		if [ "$ds" = kube-proxy ]; then
			mode=$(kubectl -n kube-system get configmap kube-proxy -o 'jsonpath={.data.config\.conf}' | sed -n 's/^ *mode: *//p')
		else
			mode=$(kubectl -n kube-system get daemonset "$ds" -o 'jsonpath={.spec.template.spec.containers[0].command}' | sed -n 's/.*--proxy-mode=\([a-z]*\).*/\1/p')
		fi
		case $proxy in
		upstream) want=iptables ;;
		upstream-nftables | ours) want=nftables ;;
		*) want=ipvs ;;
		esac
		if [ "$mode" != "$want" ]; then
			echo "conformance.sh: the kube-proxy that is up runs mode $mode, PROXY=$proxy: make cluster-down first" >&2
			exit 1
		fi
		;;
	esac
	if [ "$ds" = kube-nftproxy ]; then
		privileged=$(kubectl -n kube-system get daemonset "$ds" -o 'jsonpath={.spec.template.spec.containers[0].securityContext.privileged}')
		want=false
		[ "$proxy" = privileged ] && want=true
		if [ "${privileged:-false}" != "$want" ]; then
			echo "conformance.sh: the DaemonSet that is up is privileged=${privileged:-false}, PROXY=$proxy: make cluster-down first" >&2
			exit 1
		fi
	fi
else
	KNP_CLUSTER_PROXY=$proxy KNP_CLUSTER_FAMILY=$family KNP_CLUSTER_NODES=$nodes KNP_CLUSTER_CNI=$cni KNP_CLUSTER_LB=$lb $cluster_cmd up
fi

rm -rf "$out"
mkdir -p "$out"
echo "conformance.sh: PROXY=$proxy, KNP_CLUSTER_FAMILY=$family, KNP_CLUSTER_NODES=$nodes, KNP_CLUSTER_CNI=$cni, KNP_CLUSTER_LB=${lb:-(unset)}, $procs process(es), report in $out"
common="--kubeconfig=$dir/admin.kubeconfig --provider=skeleton --num-nodes=$nodes --report-dir=$(pwd)/$out"
start=$(date +%s)
set +e
if [ "$procs" -gt 1 ]; then
	# shellcheck disable=SC2086
	nsenter --net=/run/netns/nodenet -- "$ginkgo" run --procs="$procs" --no-color --timeout=4h \
		--focus="$focus" --skip="$skip" "$e2e" -- $common 2>&1 | tee "$out/e2e.log"
else
	# shellcheck disable=SC2086
	nsenter --net=/run/netns/nodenet -- "$e2e" $common --ginkgo.no-color --ginkgo.timeout=4h \
		--ginkgo.focus="$focus" --ginkgo.skip="$skip" 2>&1 | tee "$out/e2e.log"
fi
set -e
echo "conformance.sh: e2e.test ran $(($(date +%s) - start)) s"
exec $cluster_cmd junit "$out"/junit_*.xml

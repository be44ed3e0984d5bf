#!/usr/bin/env bash
# Runs the test cluster (make cluster) and upstream's e2e selection (make
# conformance) with each node in a user-mode Linux guest whose kernel has
# IPVS (uml-kernel.sh: a 6.1 kernel built from Debian 12's source): the way
# to run the IPVS-mode proxies (PROXY=ipvs, PROXY=upstream-ipvs), which this
# machine's kernel cannot.
#
#   hack/vm/cluster.sh                  # PROXY=ipvs: conformance.sh, then cluster down
#   PROXY=upstream-ipvs hack/vm/cluster.sh
#   hack/vm/cluster.sh up               # up and the smoke check only, then down
#   CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]' hack/vm/cluster.sh
#
# The control plane and e2e.test run here, in the node network, as for make
# cluster; each node (containerd, kubelet, the proxy and the pods) is a UML
# guest: its kernel runs as processes of this one, its eth0 a tap device on
# the node bridge, its root this machine's, read-only over hostfs under a
# tmpfs (uml-init). See e2e/cluster/vmnode.go. The cluster is taken down at
# the end; the report lands in bin/vm-cluster/$PROXY/conformance/, the
# cluster's logs (the guests' containerd and kubelet included) in
# bin/vm-cluster/$PROXY/logs/ when it failed.
#
# Environment: PROXY (default ipvs), KNP_CLUSTER_FAMILY, KNP_CLUSTER_NODES,
# CONFORMANCE_PROCS, CONFORMANCE_FOCUS, CONFORMANCE_SKIP (as make
# conformance); KNP_CLUSTER_NODE_MEM (MiB per guest, default 5120: the
# node's image store is in the guest's memory, a file in /dev/shm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
what=${1:-conformance}
case $what in
conformance | up) ;;
*)
	echo "usage: $0 [conformance|up]" >&2
	exit 2
	;;
esac
[[ $(id -u) == 0 ]] || {
	echo "cluster.sh: needs root" >&2
	exit 1
}
[[ ${KNP_CLUSTER_LB:-} == "" && ${KNP_CLUSTER_CNI:-flannel} == flannel ]] || {
	echo "cluster.sh: the guests' nodes run flannel and no load balancer (KNP_CLUSTER_LB, KNP_CLUSTER_CNI)" >&2
	exit 2
}
export PROXY=${PROXY:-ipvs} KNP_CLUSTER_PROXY=${PROXY:-ipvs}
start=$(date +%s)

make -C "$repo" --no-print-directory cluster-build cluster-images >/dev/null
out=$repo/bin/vm-cluster/$PROXY
rm -rf "$out"
mkdir -p "$out"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$out/knp-cluster" ./e2e/cluster/cmd)
KNP_CLUSTER_NODE_KERNEL=$("$here/uml-kernel.sh")
export KNP_CLUSTER_NODE_KERNEL KNP_CLUSTER_CMD=$out/knp-cluster
dir=${KNP_CLUSTER_DIR:-/var/lib/knp-cluster}
[[ ! -e $dir ]] || {
	echo "cluster.sh: a cluster is up ($dir): make cluster-down first" >&2
	exit 1
}

cd "$repo"
rc=0
case $what in
up) "$KNP_CLUSTER_CMD" up || rc=$? ;;
conformance) CONFORMANCE_OUT=${out#"$repo"/}/conformance hack/cluster/conformance.sh || rc=$? ;;
esac
if [[ $rc != 0 && -d $dir/logs ]]; then
	cp -r "$dir/logs" "$out/logs"
fi
"$KNP_CLUSTER_CMD" down || rc=1
echo "cluster.sh: PROXY=$PROXY $what rc=$rc, $(($(date +%s) - start)) s in all; report in $out"
exit $rc

#!/usr/bin/env bash
# Runs the test cluster (make cluster) and upstream's e2e selection (make
# conformance) inside one VM on Debian 12's 6.1 kernel, which has IPVS: the
# way to run the IPVS-mode proxies (PROXY=ipvs, PROXY=upstream-ipvs), which
# this machine's kernel cannot.
#
#   hack/vm/cluster.sh                  # PROXY=ipvs: conformance.sh, then cluster down
#   PROXY=upstream-ipvs hack/vm/cluster.sh
#   hack/vm/cluster.sh up               # up and the smoke check only, then down
#   CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]' hack/vm/cluster.sh
#
# The guest's root is the host's, read-only over 9p, under a tmpfs that takes
# every write (hack/vm/init, KNP_VM_HOSTROOT), so it runs the binaries and
# images hack/cluster/build.sh and images.sh cached here, from this checkout;
# the cluster command is built here, as nothing is compiled under TCG. The
# cluster, e2e.test and the proxy all run in the guest, which is gone at the
# end: nothing of the cluster is left on this machine. The report lands in
# bin/vm-cluster/$PROXY/conformance/ (JUnit and e2e.log), the guest's output
# in bin/vm-cluster/$PROXY/results.log as it runs.
#
# Environment: PROXY (default ipvs), KNP_CLUSTER_FAMILY, KNP_CLUSTER_NODES,
# KNP_CLUSTER_CNI, CONFORMANCE_PROCS, CONFORMANCE_FOCUS, CONFORMANCE_SKIP
# (as make conformance); KNP_VM_MEM (MiB, default 14336: two nodes' image
# stores are in the guest's memory), KNP_VM_SMP (default 2), KNP_VM_TIMEOUT
# (seconds, default 21600).
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
	echo "cluster.sh: needs root (the guest runs as the host's root)" >&2
	exit 1
}
export PROXY=${PROXY:-ipvs}
[[ ${KNP_CLUSTER_LB:-} == "" ]] || {
	echo "cluster.sh: KNP_CLUSTER_LB is not supported in the VM yet" >&2
	exit 2
}
start=$(date +%s)

# What the guest runs, cached or built here.
make -C "$repo" --no-print-directory cluster-build cluster-images >/dev/null
out=$repo/bin/vm-cluster/$PROXY
rm -rf "$out"
mkdir -p "$out"
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$out/knp-cluster" ./e2e/cluster/cmd)
install -m 0755 "$here/cluster-guest.sh" "$out/guest.sh"
{
	printf 'export %s=%q\n' WHAT "$what" REPO "$repo" PROXY "$PROXY"
	for v in KNP_CACHE KNP_CLUSTER_FAMILY KNP_CLUSTER_NODES KNP_CLUSTER_CNI \
		CONFORMANCE_PROCS CONFORMANCE_FOCUS CONFORMANCE_SKIP; do
		[[ -v $v ]] && printf 'export %s=%q\n' "$v" "${!v}"
	done
} >"$out/env"

echo "cluster.sh: PROXY=$PROXY $what in the VM; its output follows (also in $out/results.log)"
tail -n +1 -F "$out/results.log" 2>/dev/null &
tailer=$!
trap 'kill $tailer 2>/dev/null || true' EXIT
rc=0
KNP_VM_HOSTROOT=1 KNP_VM_MEM=${KNP_VM_MEM:-14336} KNP_VM_SMP=${KNP_VM_SMP:-2} \
	KNP_VM_TIMEOUT=${KNP_VM_TIMEOUT:-21600} "$here/boot.sh" "$out" "$out" || rc=$?
sleep 1 # let tail print the last lines
guest_rc=$(sed -n 's/^KNPVM done rc=\([0-9]*\).*/\1/p' "$out/results.log" | tail -1)
echo "cluster.sh: VM exit $rc, guest rc=${guest_rc:-none}, $(($(date +%s) - start)) s in all; report in $out/conformance"
if [[ -z $guest_rc ]]; then
	echo "cluster.sh: the guest never finished; the kernel console's end:" >&2
	tail -30 "$out/console.log" >&2
	exit 1
fi
exit "$guest_rc"

#!/usr/bin/env bash
# Runs the test cluster (make cluster) and upstream's e2e selection (make
# conformance) inside one user-mode Linux guest, a 6.1 kernel built from
# Debian 12's source with IPVS (uml-kernel.sh): the way to run the IPVS-mode
# proxies (PROXY=ipvs, PROXY=upstream-ipvs), which this machine's kernel
# cannot.
#
#   hack/vm/cluster.sh                  # PROXY=ipvs: conformance.sh, then cluster down
#   PROXY=upstream-ipvs hack/vm/cluster.sh
#   hack/vm/cluster.sh up               # up and the smoke check only, then down
#   CONFORMANCE_FOCUS='\[sig-network\] Services .*\[Conformance\]' hack/vm/cluster.sh
#
# UML runs the guest's kernel as a process here: the guest's code runs at
# native speed and only its system calls cost more, where QEMU's TCG (KVM is
# unusable on this machine) emulates every instruction. The guest's root is
# the host's, read-only over hostfs, under a tmpfs that takes every write
# (uml-init), so it runs the binaries and images hack/cluster/build.sh and
# images.sh cached here, from this checkout. The cluster, e2e.test and the
# proxy all run in the guest, which is gone at the end: nothing of the
# cluster is left on this machine. The report lands in
# bin/vm-cluster/$PROXY/conformance/ (JUnit and e2e.log), the guest's output
# in bin/vm-cluster/$PROXY/results.log as it runs, and the cluster's logs in
# bin/vm-cluster/$PROXY/logs/ when it failed.
#
# Environment: PROXY (default ipvs), KNP_CLUSTER_FAMILY, KNP_CLUSTER_NODES,
# KNP_CLUSTER_CNI, CONFORMANCE_PROCS, CONFORMANCE_FOCUS, CONFORMANCE_SKIP
# (as make conformance); KNP_VM_MEM (MiB, default 12288: two nodes' image
# stores are in the guest's memory, which is a file in /dev/shm),
# KNP_VM_TIMEOUT (seconds, default 21600).
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
linux=$("$here/uml-kernel.sh")
rc=0
TMPDIR=/dev/shm timeout --kill-after=10 "${KNP_VM_TIMEOUT:-21600}" \
	"$linux" mem="${KNP_VM_MEM:-12288}M" root=/dev/root rootfstype=hostfs rootflags=/ ro \
	init="$here/uml-init" knp.share="$out" con=null con0=null,fd:1 \
	</dev/null >"$out/console.log" 2>&1 || rc=$?
sleep 1 # let tail print the last lines
guest_rc=$(sed -n 's/^KNPVM done rc=\([0-9]*\).*/\1/p' "$out/results.log" | tail -1)
echo "cluster.sh: UML exit $rc, guest rc=${guest_rc:-none}, $(($(date +%s) - start)) s in all; report in $out/conformance"
if [[ -z $guest_rc ]]; then
	echo "cluster.sh: the guest never finished; the kernel console's end:" >&2
	tail -30 "$out/console.log" >&2
	exit 1
fi
exit "$guest_rc"

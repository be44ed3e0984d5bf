#!/bin/sh
# Runs the conformance selection (conformance.sh) several times back to back
# on one cluster and keeps, for every run, the JUnit report, e2e.test's log,
# the proxy pods' logs and the cluster's events over the run: what a failure
# needs to be explained. Prints a table: run, ran, passed, failed, the names
# of the failed specs.
#
#   RUNS=5 hack/cluster/flakes.sh                 # kube-nftproxy (deploy/)
#   RUNS=5 PROXY=upstream hack/cluster/flakes.sh  # kube-proxy v1.37.1, the baseline
#
# Every variable of conformance.sh applies (PROXY, KNP_CLUSTER_FAMILY, ...).
# Reports go to bin/flakes/$PROXY/run-N, the logs and events to run-N-logs
# (FLAKES_OUT replaces bin/flakes/$PROXY).
# The cluster stays up afterwards (make cluster-down).
set -eu
cd "$(dirname "$0")/../.."
cache=${KNP_CACHE:-/var/cache/kube-nftproxy}
dir=${KNP_CLUSTER_DIR:-/var/lib/knp-cluster}
runs=${RUNS:-5}
proxy=${PROXY:-ours}
out=${FLAKES_OUT:-bin/flakes/$proxy}
case $proxy in
ours | privileged | localhost | ipvs) ds=kube-nftproxy ;;
*) ds=kube-proxy ;;
esac
kubectl() { nsenter --net=/run/netns/nodenet -- "$cache/k8s-v1.37.1/bin/kubectl" --kubeconfig="$dir/admin.kubeconfig" "$@"; }

# follow_logs keeps every proxy pod's log over a run in DIR/POD.log (each
# sync that wrote something is a line with its time), following the pods
# the run deletes and the ones that replace them, until it is killed.
follow_logs() {
	followed= pids=
	trap 'kill $pids 2>/dev/null; exit 0' TERM
	while :; do
		for pod in $(kubectl -n kube-system get pods -o name 2>/dev/null | sed -n "s|^pod/\($ds-[a-z0-9]*\)$|\1|p"); do
			case " $followed " in *" $pod "*) continue ;; esac
			followed="$followed $pod"
			kubectl -n kube-system logs --timestamps -f "$pod" >"$1/$pod.log" 2>&1 &
			pids="$pids $!"
		done
		sleep 5
	done
}

mkdir -p "$out"
: >"$out/table"
i=1
while [ "$i" -le "$runs" ]; do
	run=$out/run-$i
	mkdir -p "$run-logs"
	start=$(date +%s)
	status=passed
	follow_logs "$run-logs" &
	follower=$!
	CONFORMANCE_OUT=$run hack/cluster/conformance.sh >"$out/run-$i.log" 2>&1 || status=failed
	took=$(($(date +%s) - start))
	kill "$follower" 2>/dev/null || true
	wait "$follower" 2>/dev/null || true
	kubectl get events -A -o wide --sort-by=.lastTimestamp >"$run-logs/events.txt" 2>&1 || true
	summary=$(go run ./e2e/cluster/cmd junit "$run"/junit_*.xml 2>&1 || true)
	counts=$(echo "$summary" | head -n 1)
	failed=$(echo "$summary" | sed -n 's/^  FAILED  //p' | tr '\n' ';')
	printf '%s\t%s\t%s s\t%s\t%s\n' "$i" "$status" "$took" "$counts" "${failed:--}" | tee -a "$out/table"
	i=$((i + 1))
done
echo "flakes.sh: $runs runs of PROXY=$proxy; the table is $out/table"

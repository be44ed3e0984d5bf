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
# Reports go to bin/flakes/$PROXY/run-N (FLAKES_OUT replaces bin/flakes/$PROXY).
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

mkdir -p "$out"
: >"$out/table"
i=1
while [ "$i" -le "$runs" ]; do
	run=$out/run-$i
	since=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	start=$(date +%s)
	status=passed
	CONFORMANCE_OUT=$run hack/cluster/conformance.sh >"$out/run-$i.log" 2>&1 || status=failed
	took=$(($(date +%s) - start))
	# Evidence for each failure: every proxy pod's log (each sync that wrote
	# something is a line with its time) and the events, over the run.
	for pod in $(kubectl -n kube-system get pods -o name -l "k8s-app=$ds" 2>/dev/null || kubectl -n kube-system get pods -o name | grep "/$ds-"); do
		kubectl -n kube-system logs --timestamps --since-time="$since" "$pod" >"$run/${pod#pod/}.log" 2>&1 || true
	done
	kubectl get events -A -o wide --sort-by=.lastTimestamp >"$run/events.txt" 2>&1 || true
	summary=$(go run ./e2e/cluster/cmd junit "$run"/junit_*.xml 2>&1 || true)
	counts=$(echo "$summary" | head -n 1)
	failed=$(echo "$summary" | sed -n 's/^  FAILED  //p' | tr '\n' ';')
	printf '%s\t%s\t%s s\t%s\t%s\n' "$i" "$status" "$took" "$counts" "${failed:--}" | tee -a "$out/table"
	i=$((i + 1))
done
echo "flakes.sh: $runs runs of PROXY=$proxy; the table is $out/table"

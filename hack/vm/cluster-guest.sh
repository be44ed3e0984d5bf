#!/bin/sh
# In the UML guest (hack/vm/cluster.sh), on the host's root: brings the
# cluster up and runs hack/cluster/conformance.sh (or only up), then takes
# the cluster down. $1 is the results file; the share (this script's
# directory) holds env, the cluster command, and takes the report.
exec >"$1" 2>&1
share=$(cd "$(dirname "$0")" && pwd)
. "$share/env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
export KNP_CLUSTER_CMD=$share/knp-cluster KNP_CLUSTER_PROXY=$PROXY
echo "cluster-guest: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) MiB, PROXY=$PROXY"
# containerd's overlay snapshots cannot sit on the overlay root: the
# cluster's directory is on a tmpfs of its own.
mkdir -p /var/lib/knp-vm
mount -t tmpfs -o mode=0755 tmpfs /var/lib/knp-vm
export KNP_CLUSTER_DIR=/var/lib/knp-vm/cluster
cd "$REPO" || exit 1
# What the guest's CPUs spend their time on, every two minutes (TCG makes
# every daemon's idle cost many times a real node's).
while sleep 120; do
	{ date; top -b -n 1 -w 200 | head -25; } >>"$share/top.log" 2>&1
done &
t0=$(date +%s)
rc=0
case $WHAT in
up)
	"$KNP_CLUSTER_CMD" up || rc=$?
	;;
conformance)
	CONFORMANCE_OUT=$share/conformance hack/cluster/conformance.sh || rc=$?
	;;
esac
# The cluster's directory is gone with the guest: a failure's logs are kept.
if [ $rc != 0 ]; then
	cp -r "$KNP_CLUSTER_DIR/logs" "$share/logs" || echo "cluster-guest: no logs kept"
	for d in "$KNP_CLUSTER_DIR"/*/pod-logs; do
		[ -d "$d" ] && cp -r "$d" "$share/logs/$(basename "$(dirname "$d")")-pod-logs"
	done
fi
echo "cluster-guest: $WHAT rc=$rc after $(($(date +%s) - t0)) s"
"$KNP_CLUSTER_CMD" down || echo "cluster-guest: down failed"
exit $rc

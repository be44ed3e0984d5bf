#!/usr/bin/env bash
# Waits for the cluster tier's builds that .ci/run started in the background
# on a cold cache (hack/cluster/build.sh, then images.sh), so that the
# package and VM tests run while Kubernetes compiles.
#
#   hack/cluster/await-build.sh STATUS_FILE DEADLINE
#
# STATUS_FILE is written with the builds' exit status when they end; their
# output is in STATUS_FILE.log. DEADLINE is a Unix time: CI's last moment to
# start the tier and still end within its limit.
#
# Exit 0 with nothing printed: the builds passed, run the tier. Exit 0 with
# a line on stdout: the deadline came first; the line says why the tier is
# skipped. Exit 1: the builds failed (their log's end is on stderr).
set -euo pipefail
(($# == 2)) || {
	sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
status_file=$1 deadline=$2
start=$SECONDS
announced=0
until [[ -s $status_file ]]; do
	now=$(date +%s)
	if ((now >= deadline)); then
		echo "the cluster cache was cold and its build had not finished by $(date -u -d "@$deadline" +%H:%M:%S) UTC, CI's last moment to start the tier; the build's log: $status_file.log"
		exit 0
	fi
	if ((!announced)); then
		echo "await-build: waiting for the cluster's builds (cold cache), until $(date -u -d "@$deadline" +%H:%M:%S) UTC at most" >&2
		announced=1
	fi
	sleep 5
done
status=$(<"$status_file")
if [[ $status != 0 ]]; then
	echo "await-build: the cluster's builds failed (exit $status); the end of $status_file.log:" >&2
	tail -n 40 "$status_file.log" >&2 || true
	exit 1
fi
echo "await-build: the cluster's builds were done $((SECONDS - start)) s after the tier asked for them" >&2

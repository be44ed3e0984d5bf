#!/usr/bin/env bash
# Runs lanes side by side: each lane is commands run one after the other,
# its output kept in a file and printed whole when the lane ends (so that
# lanes never interleave), with its status and time. Exits 1 if any lane
# failed, after all have ended.
#
#   hack/lanes.sh DIR 'NAME=COMMAND' ['NAME=COMMAND' ...]
#
# make test runs the VM tier and the cluster tier this way: the VM tier's
# emulated CPU keeps one core busy while the cluster tier mostly waits for
# pods.
set -uo pipefail

(($# >= 2)) || {
	sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
dir=$1
shift
mkdir -p "$dir"

# lane NAME COMMAND: runs COMMAND, then prints its log under the print lock.
lane() {
	local name=$1 cmd=$2 start=$SECONDS status=0
	bash -c "$cmd" >"$dir/$name.log" 2>&1 || status=$?
	(
		flock 9
		echo "=== lane $name: $cmd"
		cat "$dir/$name.log"
		if ((status == 0)); then
			echo "=== lane $name passed in $((SECONDS - start)) s"
		else
			echo "=== lane $name FAILED (exit $status) in $((SECONDS - start)) s"
		fi
	) 9>"$dir/.print.lock"
	return "$status"
}

pids=()
for spec in "$@"; do
	name=${spec%%=*}
	[[ $name != "$spec" && -n $name ]] || {
		echo "lanes.sh: '$spec' is not NAME=COMMAND" >&2
		exit 2
	}
	lane "$name" "${spec#*=}" &
	pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
	wait "$pid" || failed=1
done
exit "$failed"

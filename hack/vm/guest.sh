#!/bin/sh
# Runs in the VM (busybox sh, from the read-only 9p share): every test binary
# under tests/ in name order, each in its own directory (its package's
# testdata is there), with the flags listed one per line in its "flags" file.
# Protocol lines on the results port ($1, the second serial port):
#   KNPVM start <name>
#   ...the binary's combined output...
#   KNPVM end <name> rc=<exit code> secs=<wall seconds>
exec 3>"$1"
here=$(dirname "$0")
# Tests can tell they run in the VM (internal/vmguest reads this).
export KNP_VM_GUEST=1
rc=0
for dir in "$here"/tests/*/; do
	[ -x "$dir/test" ] || continue
	name=$(basename "$dir")
	set --
	if [ -f "$dir/flags" ]; then
		while IFS= read -r f; do set -- "$@" "$f"; done <"$dir/flags"
	fi
	echo "KNPVM start $name" >&3
	t0=$(cut -d' ' -f1 /proc/uptime)
	(cd "$dir" && ./test "$@") >&3 2>&1
	r=$?
	t1=$(cut -d' ' -f1 /proc/uptime)
	# A newline first: the output may not end with one.
	printf '\nKNPVM end %s rc=%d secs=%s\n' "$name" "$r" "$(awk "BEGIN{print $t1-$t0}")" >&3
	[ "$r" = 0 ] || rc=1
done
exit $rc

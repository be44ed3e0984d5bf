#!/usr/bin/env bash
# Runs Go test packages inside a QEMU VM with a Debian kernel (6.1 from the
# host's apt sources, or 5.10 with KNP_VM_SUITE=bullseye; real IPVS, dummy
# links, modules), in one boot, and turns the guest's results into a
# host-side pass/fail.
#
#   hack/vm/run.sh PKG... [go test flags]
#   hack/vm/run.sh ./nft -run TestKernel -v
#   hack/vm/run.sh ./ipvs -run '^$' -bench BenchmarkSync -benchtime 1x
#
# PKG are go list patterns (./internal/... works; packages without tests are
# skipped). The flags after them go to every test binary; go test's short
# names (-run, -bench, -v, -count, -benchtime, ...) are accepted and passed
# as -test.<name>. Each package is built with CGO_ENABLED=0 go test -c and
# runs in a copy of its directory's testdata, as root, with KNP_VM_GUEST=1.
#
# Environment:
#   KNP_VM_TIMEOUT   seconds for the whole boot (default 900); each binary
#                    gets -test.timeout a little below it unless given one
#   KNP_VM_KEEP=1    keep the share and the logs (path printed) for debugging
#   KNP_VM_MEM, KNP_VM_SMP, KNP_VM_SUITE, KNP_VM_KERNEL, KNP_CACHE: see
#                    boot.sh, prepare.sh
#
# Exit status: 0 if every package passed; 1 if any failed, or the guest
# crashed, timed out or never ran a test; 2 on usage or build errors.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
GO=${GO:-go}
if ! command -v "$GO" >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
	GO=/usr/local/go/bin/go
fi
timeout_s=${KNP_VM_TIMEOUT:-900}

usage() {
	sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

pkgs=()
while (($#)) && [[ $1 != -* ]]; do
	pkgs+=("$1")
	shift
done
((${#pkgs[@]})) || usage
flags=()
have_timeout=
for f in "$@"; do
	case $f in
	--) continue ;;
	-test.*) ;;
	--*) f=-test.${f#--} ;;
	-*) f=-test.${f#-} ;;
	esac
	[[ $f == -test.timeout* ]] && have_timeout=1
	flags+=("$f")
done
# The binaries time out (and print their goroutines) before the VM is
# killed: a tenth of the budget earlier, at least 30 s (the boot itself
# takes 3-10 s on a busy machine), at most 60 s.
margin=$((timeout_s / 10))
((margin >= 30)) || margin=30
((margin <= 60)) || margin=60
test_timeout=$((timeout_s - margin))
((test_timeout >= timeout_s / 2)) || test_timeout=$((timeout_s / 2))
[[ -n $have_timeout ]] || flags+=("-test.timeout=${test_timeout}s")

[[ $(id -u) == 0 ]] || {
	echo "run.sh: needs root (installs packages, writes $("$here/prepare.sh" --print 2>/dev/null || echo the cache))" >&2
	exit 2
}

start=$(date +%s)
KNP_VM_DIR=$("$here/prepare.sh")
export KNP_VM_DIR
prepared=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/knp-vm-run.XXXXXX")
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	if [[ ${KNP_VM_KEEP:-} == 1 ]]; then
		echo "run.sh: kept $work" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
share=$work/share
mkdir -p "$share/tests"
install -m 0755 "$here/guest.sh" "$share/guest.sh"

# Build one static test binary per package that has tests.
cd "$repo"
mapfile -t listed < <("$GO" list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "${pkgs[@]}")
module=$("$GO" list -m)
names=()
n=0
for line in "${listed[@]}"; do
	[[ -n $line ]] || continue
	read -r ipath dir <<<"$line"
	rel=${ipath#"$module"/}
	[[ $rel == "$module" ]] && rel=root
	name=$(printf '%02d-%s' "$n" "${rel//\//_}")
	n=$((n + 1))
	mkdir -p "$share/tests/$name"
	# -trimpath: the build cache then serves any checkout of the same
	# sources, wherever it is (CI clones anew each time).
	if ! CGO_ENABLED=0 "$GO" test -trimpath -c -o "$share/tests/$name/test" "$ipath"; then
		echo "run.sh: building the tests of $ipath failed" >&2
		exit 2
	fi
	if [[ -d $dir/testdata ]]; then
		cp -rL "$dir/testdata" "$share/tests/$name/"
	fi
	printf '%s\n' "${flags[@]}" >"$share/tests/$name/flags"
	names+=("$name")
done
((${#names[@]})) || {
	echo "run.sh: no test files in ${pkgs[*]}" >&2
	exit 2
}
built=$(date +%s)

echo "run.sh: booting $(basename "$KNP_VM_DIR") for ${#names[@]} package(s), timeout ${timeout_s}s" >&2
boot_rc=0
KNP_VM_TIMEOUT=$timeout_s "$here/boot.sh" "$share" "$work" || boot_rc=$?
booted=$(date +%s)

# Turn the protocol lines (see guest.sh) into output and a verdict.
tr -d '\r' <"$work/results.log" >"$work/results.txt"
verdict=0
awk -v boot_rc="$boot_rc" -v timeout_s="$timeout_s" -v expected="${#names[@]}" '
	function flush_line(l) { if (cur != "") print "    " l; else print l }
	/KNPVM warning / { sub(/.*KNPVM warning /, ""); print "run.sh: guest warning: " $0; next }
	/KNPVM fatal / { sub(/.*KNPVM fatal /, ""); print "run.sh: FAIL: guest init: " $0; bad = 1; next }
	/KNPVM boot / { sub(/.*KNPVM boot /, ""); print "run.sh: guest up: " $0; next }
	/KNPVM start / { cur = $3; started++; print "=== " cur; next }
	/KNPVM end / {
		pre = $0; sub(/KNPVM end .*/, "", pre)
		if (pre != "") flush_line(pre)
		sub(/.*KNPVM end /, "")
		rc = $2; sub(/rc=/, "", rc); secs = $3; sub(/secs=/, "", secs)
		if (rc == 0) { printf "ok   %s (%ss in the guest)\n", $1, secs; passed++ }
		else { printf "FAIL %s (exit %s, %ss in the guest)\n", $1, rc, secs; bad = 1 }
		cur = ""; next
	}
	/KNPVM done / { done = 1; next }
	{ flush_line($0) }
	END {
		if (cur != "") {
			if (boot_rc == 124 || boot_rc == 137) printf "FAIL %s: the VM timed out after %ss while it ran\n", cur, timeout_s
			else printf "FAIL %s: the guest stopped while it ran (crash or panic: see the console log)\n", cur
			bad = 1
		} else if (!done) {
			if (boot_rc == 124 || boot_rc == 137) printf "run.sh: FAIL: the VM timed out after %ss\n", timeout_s
			else printf "run.sh: FAIL: the guest stopped before it finished (qemu exit %s)\n", boot_rc
			bad = 1
		}
		if (started < expected) { printf "run.sh: FAIL: %d of %d package(s) never ran\n", expected - started, expected; bad = 1 }
		exit bad
	}' "$work/results.txt" || verdict=1
if ((boot_rc != 0)) && ((verdict == 0)); then
	echo "run.sh: FAIL: qemu exited with status $boot_rc" >&2
	verdict=1
fi
if ((verdict != 0)); then
	echo "run.sh: last lines of the guest console:" >&2
	tail -n 30 "$work/console.log" | tr -d '\r' | sed 's/^/    /' >&2
fi
echo "run.sh: $( ((verdict == 0)) && echo PASS || echo FAIL): prepare $((prepared - start))s, build $((built - prepared))s, boot and tests $((booted - built))s, total $(($(date +%s) - start))s" >&2
exit "$verdict"

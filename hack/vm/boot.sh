#!/usr/bin/env bash
# Boots the VM test tier's kernel once: the guest runs SHARE/guest.sh from a
# read-only 9p share and powers off.
#
#   hack/vm/boot.sh SHARE OUTDIR
#
# Writes OUTDIR/results.log (the guest's second serial port: protocol lines
# and test output, see guest.sh) and OUTDIR/console.log (kernel console).
# Exits with qemu's status, or 124 if the boot exceeded the timeout.
#
# Environment:
#   KNP_VM_TIMEOUT   seconds before the VM is killed (default 600)
#   KNP_VM_MEM       guest memory in MiB (default 1024)
#   KNP_VM_SMP       guest CPUs (default 1; see README.md)
#   KNP_VM_DIR       a prepared cache directory (default: run prepare.sh)
#   KNP_VM_GUESTFWD  space-separated GUEST_IP:PORT=HOST_PORT forwards: the
#                    guest gets a virtio NIC on QEMU's user-mode network,
#                    restricted (no route out), whose only reachable
#                    addresses are these, each to 127.0.0.1:HOST_PORT on
#                    the host (the benchmark's API server). Unset: no NIC.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
[[ $# == 2 ]] || {
	echo "usage: $0 SHARE OUTDIR" >&2
	exit 2
}
share=$(cd "$1" && pwd)
outdir=$2
timeout_s=${KNP_VM_TIMEOUT:-600}
mem=${KNP_VM_MEM:-1024}
smp=${KNP_VM_SMP:-1}

# run.sh has prepared the cache already and says where it is.
cache=${KNP_VM_DIR:-$("$here/prepare.sh")}
[[ -x $share/guest.sh ]] || {
	echo "boot.sh: $share/guest.sh missing or not executable" >&2
	exit 2
}
mkdir -p "$outdir"

nic=(-nic none)
if [[ -n ${KNP_VM_GUESTFWD:-} ]]; then
	netdev=user,id=n0,restrict=on
	for fwd in $KNP_VM_GUESTFWD; do
		[[ $fwd =~ ^([0-9.]+):([0-9]+)=([0-9]+)$ ]] || {
			echo "boot.sh: KNP_VM_GUESTFWD entry $fwd is not GUEST_IP:PORT=HOST_PORT" >&2
			exit 2
		}
		# A command per connection: a chardev target (tcp:HOST:PORT) is a
		# single connection that every guest connection would share.
		netdev+=",guestfwd=tcp:${BASH_REMATCH[1]}:${BASH_REMATCH[2]}-cmd:/bin/busybox nc 127.0.0.1 ${BASH_REMATCH[3]}"
	done
	nic=(-netdev "$netdev" -device virtio-net-pci,netdev=n0)
fi

append="console=ttyS0 panic=-1 quiet mitigations=off"
shares=(-virtfs "local,path=$share,mount_tag=share,security_model=none,readonly=on")

# /init comes from this checkout, not the cache: the kernel unpacks
# concatenated cpio archives in order, so a small one appended to the cached
# base archive adds (or replaces) it.
initdir=$(mktemp -d "${TMPDIR:-/tmp}/knp-vm-init.XXXXXX")
trap 'rm -rf "$initdir"' EXIT
install -m 0755 "$here/init" "$initdir/init"
(cd "$initdir" && echo init | cpio -o -H newc --quiet >init.cpio)
cat "$cache/base.cpio" "$initdir/init.cpio" >"$initdir/initramfs.cpio"

: >"$outdir/results.log"
: >"$outdir/console.log"
# TCG (KVM is unusable here); PVH boot of the ELF vmlinux; no network device
# unless forwards were asked for; panic=-1 with -no-reboot turns a guest panic into a qemu exit.
rc=0
timeout --kill-after=10 "$timeout_s" \
	qemu-system-x86_64 -accel tcg -machine pc -m "$mem" -smp "$smp" \
	-kernel "$cache/vmlinux" -initrd "$initdir/initramfs.cpio" \
	-append "$append" \
	-no-reboot "${nic[@]}" -display none -monitor none -nodefaults \
	-serial "file:$outdir/console.log" -serial "file:$outdir/results.log" \
	"${shares[@]}" \
	</dev/null || rc=$?
exit "$rc"

#!/usr/bin/env bash
# Builds (once) the user-mode Linux kernel cluster.sh boots, and prints its
# path: Debian 12's kernel source (linux-source-6.1, installed with apt-get
# when missing), ARCH=um's defconfig, every option in uml.config built in,
# no modules. Debian's own UML kernel (user-mode-linux) cannot serve: its
# nf_tables has no ip, ip6 or inet family.
#
# Cached in $KNP_CACHE/vm/uml-<source version>-<config hash>/linux, so an
# edit of uml.config or a new source package builds anew. About 15 minutes
# on two cores. With --cached it builds nothing: it prints the path when
# the kernel is cached and fails otherwise.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KNP_CACHE:-/var/cache/kube-nftproxy}
log() { echo "uml-kernel.sh: $*" >&2; }

cached_only=0
[[ ${1:-} == --cached ]] && cached_only=1
pkgs=()
((cached_only)) || [[ -f /usr/src/linux-source-6.1.tar.xz ]] || pkgs+=(linux-source-6.1)
for tool in bc flex bison make gcc; do
	((cached_only)) || command -v $tool >/dev/null || pkgs+=("$tool")
done
if ((${#pkgs[@]})); then
	log "installing ${pkgs[*]}"
	# Package lists older than the mirror name files it no longer has:
	# refreshed once when the install fails.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >&2 || {
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >&2
	}
fi
version=$(dpkg-query -W -f '${Version}' linux-source-6.1 2>/dev/null) || {
	log "linux-source-6.1 is not installed: no UML kernel is cached"
	exit 1
}
options=$(grep -v '^#' "$here/uml.config")
dir=$cache/vm/uml-$version-$(sha256sum <<<"$options" | cut -c1-12)
if [[ -x $dir/linux ]]; then
	echo "$dir/linux"
	exit 0
fi
if ((cached_only)); then
	log "not cached: $dir/linux"
	exit 1
fi

work=$(mktemp -d "$cache/vm/.uml-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building the UML kernel from linux-source-6.1 $version in $work"
tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$work"
src=$work/linux-source-6.1
make -C "$src" ARCH=um defconfig >/dev/null
enable=()
for o in $options; do enable+=(--enable "$o"); done
"$src/scripts/config" --file "$src/.config" --disable MODULES "${enable[@]}"
make -C "$src" ARCH=um olddefconfig >/dev/null
missing=()
for o in $options; do
	grep -q "^CONFIG_$o=y" "$src/.config" || missing+=("$o")
done
if ((${#missing[@]})); then
	log "options the kernel's dependencies turned off: ${missing[*]}"
	exit 1
fi
make -C "$src" ARCH=um -j"$(nproc)" linux >"$work/build.log" 2>&1 || {
	tail -30 "$work/build.log" >&2
	log "build failed"
	exit 1
}
mkdir -p "$dir"
install -m 0755 "$src/linux" "$dir/linux"
cp "$src/.config" "$dir/config"
log "built $dir/linux"
echo "$dir/linux"

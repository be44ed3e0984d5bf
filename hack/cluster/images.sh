#!/usr/bin/env bash
# Builds the container images of the two-node test cluster (hack/cluster) as
# docker archives, without a registry or a container engine, for the nodes
# to import with `ctr -n k8s.io images import`:
#
#   hack/cluster/images.sh              # build (or reuse) every image
#   hack/cluster/images.sh --print-dir  # print the output directory
#
# Output, $KNP_CACHE/cluster/images/:
#   <name>.tar     one docker archive per image (it may carry several tags);
#                  kube-nftproxy.tar is an OCI layout archive (make image's)
#   images.txt     one line per image reference: "<reference> <file name>";
#                  several references may name the same file
#
# Every name is the one its user pulls: e2e.test's (test/utils/image/
# manifest.go of k8s.io/kubernetes), the kubelet's sandbox image, kubeadm's
# CoreDNS, the flannel manifest's, deploy/base/daemonset.yaml's. The nodes have
# no network, so a name that differs by a character means a failed pull.
#
# Inputs (the other cluster scripts build them; each can be overridden):
#   $KNP_CACHE/k8s-v1.37.1/bin/{agnhost,kube-proxy}  KNP_IMAGES_AGNHOST, KNP_IMAGES_KUBE_PROXY
#   $KNP_CACHE/cluster/bin/{coredns,flanneld}        KNP_IMAGES_COREDNS, KNP_IMAGES_FLANNELD
#   $KNP_CACHE/cluster/bin/cni/flannel               KNP_IMAGES_FLANNEL_CNI
#   $KNP_CACHE/cluster/bin/metallb-{controller,speaker}
#       KNP_IMAGES_METALLB_CONTROLLER, KNP_IMAGES_METALLB_SPEAKER: built when
#       they exist, required with KNP_CLUSTER_LB=metallb (the cluster
#       imports them into the nodes only then)
# Built here: pause (gcc -static from the Kubernetes module), kube-nftproxy
# (this repository: make image's OCI archive, hack/image.sh, copied under
# the cluster's names), regression-issue-74839 (Kubernetes module), flannel's
# install-conf (flannel module), a Debian bookworm minbase root file system
# (debootstrap, from the machine's apt mirror) shared by the images that
# need a userland, and a busybox tree from the machine's static busybox.
#
# Each image and shared layer is skipped when its inputs are unchanged (a
# hash of them in a .stamp file next to it). An image whose input binary is
# missing is left out, reported, and the script exits 1 after building the
# others.
#
# Environment: KNP_CACHE (default /var/cache/kube-nftproxy), KNP_GOCACHE
# (default $KNP_CACHE/gocache), KNP_BUILD_NICE (default 10),
# KNP_FLANNEL_VERSION (default v0.28.10), KNP_FLANNEL_CNI_TAG (default
# v1.9.1-flannel3), KNP_DEBIAN_MIRROR (default: the first URI in
# /etc/apt/sources.list.d/debian.sources).
set -euo pipefail

K8S_VERSION=v1.37.1
CACHE_ROOT=${KNP_CACHE:-/var/cache/kube-nftproxy}
OUT=$CACHE_ROOT/cluster/images
WORK=$OUT/.work
K8S_BIN=$CACHE_ROOT/k8s-$K8S_VERSION/bin
CLUSTER_BIN=$CACHE_ROOT/cluster/bin
FLANNEL_VERSION=${KNP_FLANNEL_VERSION:-v0.28.10}
FLANNEL_CNI_TAG=${KNP_FLANNEL_CNI_TAG:-v1.9.1-flannel3}
NICE=${KNP_BUILD_NICE:-10}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEBIAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

if [[ ${1:-} == --print-dir ]]; then
	echo "$OUT"
	exit 0
fi

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
export GOCACHE=${KNP_GOCACHE:-$CACHE_ROOT/gocache}
niceprefix=()
if [[ $NICE != 0 ]]; then
	niceprefix=(nice -n "$NICE")
fi

log() { echo "images.sh: $*"; }
die() {
	echo "images.sh: $*" >&2
	exit 1
}
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1fs", e - s }'; }

mkdir -p "$WORK/bin"
exec 9>"$OUT/.lock"
flock 9
total_start=$(now)

# --- sources ------------------------------------------------------------

# module_dir MODULE@VERSION: the module's directory in the module cache.
module_dir() {
	local dir
	dir=$(cd "$WORK" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
	[[ -n $dir && -d $dir ]] || die "could not download $1"
	echo "$dir"
}

K8S_DIR=$(module_dir "k8s.io/kubernetes@$K8S_VERSION")
MANIFEST=$K8S_DIR/test/utils/image/manifest.go

# e2e_ref ID: the reference e2e.test uses for imageutils.ID, read from
# manifest.go's default registry list and its configs[ID] line.
e2e_ref() {
	local ref
	ref=$(awk -v id="$1" '
		/^[[:space:]]*[A-Za-z0-9]+Registry:[[:space:]]*"/ {
			key = $1; sub(/:$/, "", key); v = $2; gsub(/[",]/, "", v); reg[key] = v
		}
		index($0, "configs[" id "] = Config{list.") {
			split($0, p, /[{}"]/); r = p[2]; sub(/^list\./, "", r); sub(/,.*/, "", r)
			print reg[r] "/" p[3] ":" p[5]; exit
		}' "$MANIFEST")
	[[ $ref == */*:* && $ref != /* ]] || die "no image $1 in $MANIFEST"
	echo "$ref"
}

# kubeadm_const NAME: a string constant of kubeadm's constants.go.
kubeadm_const() {
	sed -n "s/^[[:space:]]*$1[[:space:]]*= \"\(.*\)\"/\1/p" "$K8S_DIR/cmd/kubeadm/app/constants/constants.go" | head -1
}

# --- binaries built here ------------------------------------------------

TOOL=$WORK/bin/cluster-images
build_tool() {
	(cd "$REPO/hack/cluster/images" && "${niceprefix[@]}" go build -trimpath -o "$TOOL.tmp" .)
	mv -f "$TOOL.tmp" "$TOOL"
}

build_pause() {
	local src=$K8S_DIR/build/pause/linux/pause.c tag=$1
	PAUSE_BIN=$WORK/bin/pause-$tag
	[[ -x $PAUSE_BIN ]] && return
	command -v gcc >/dev/null || die "gcc not found (apt-get install gcc libc6-dev)"
	"${niceprefix[@]}" gcc -Os -Wall -Werror -static "-DVERSION=v$tag" -o "$PAUSE_BIN.tmp" "$src"
	mv -f "$PAUSE_BIN.tmp" "$PAUSE_BIN"
}

# build_kube_nftproxy: make image's archive (hack/image.sh: both platforms,
# reproducible, so the same index digest as make image at this commit),
# which build_images copies under the cluster's names.
build_kube_nftproxy() {
	KNP_VERSION=$("$REPO/hack/version.sh")
	KNP_IMAGE=$WORK/kube-nftproxy-image.tar
	IMAGE_OUT=$KNP_IMAGE "${niceprefix[@]}" "$REPO/hack/image.sh"
}

# build_in_module OUT REQUIRE PKG [FILES...]: builds PKG (with FILES: the
# main package of those files, copied from the module cache) in a throwaway
# module requiring REQUIRE ("module version"); nothing lands in the repository.
build_in_module() {
	local out=$1 require=$2 pkg=$3
	shift 3
	[[ -x $out ]] && return
	local tmp
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/knp-images-mod.XXXXXX")
	printf 'module knp.local/images-helper\n\ngo %s\n\nrequire %s\n' \
		"$(go env GOVERSION | sed 's/^go//')" "$require" >"$tmp/go.mod"
	if (($#)); then cp "$@" "$tmp/" && chmod u+w "$tmp"/*.go; fi
	(cd "$tmp" && "${niceprefix[@]}" go build -trimpath -ldflags "-s -w" -o "$out.tmp" "$pkg") ||
		{ rm -rf "$tmp"; die "building $pkg failed"; }
	rm -rf "$tmp"
	mv -f "$out.tmp" "$out"
}

build_regression_74839() {
	local dir=$K8S_DIR/test/images/regression-issue-74839 utils
	REGRESSION_BIN=$WORK/bin/regression-issue-74839-$K8S_VERSION
	# Its only dependency is k8s.io/utils, at the version Kubernetes pins.
	utils=$(awk '$1 == "k8s.io/utils" { print $1 " " $2; exit }' "$K8S_DIR/go.mod")
	build_in_module "$REGRESSION_BIN" "$utils" . "$dir/main.go" "$dir/tcp.go"
}

build_install_conf() {
	INSTALL_CONF_BIN=$WORK/bin/flannel-install-conf-$FLANNEL_VERSION
	build_in_module "$INSTALL_CONF_BIN" "github.com/flannel-io/flannel $FLANNEL_VERSION" \
		github.com/flannel-io/flannel/cmd/install_conf
}

# --- shared layers --------------------------------------------------------

# What the Debian-based images exec: agnhost's Dockerfile installs bind-tools
# (dig), curl, netcat-openbsd, iproute2 (ip, ss), iperf, bash, util-linux
# (ipcs), socat; busybox gave it wget (GNU wget here: busybox's crashed in a
# glibc root), ping, ps, netstat. distroless-iptables and kube-proxy need
# iptables, ip6tables, nft, conntrack, ipset; flannel iproute2 and iptables;
# nginx is the nginx images' server. One root file system for all of them
# is one layer in every node's content store.
DEBIAN_SUITE=bookworm
DEBIAN_PACKAGES=ca-certificates,wget,curl,netcat-openbsd,dnsutils,iproute2,iperf,socat,iputils-ping,procps,net-tools,iptables,nftables,conntrack,ipset,nginx

debian_mirror() {
	if [[ -n ${KNP_DEBIAN_MIRROR:-} ]]; then
		echo "$KNP_DEBIAN_MIRROR"
		return
	fi
	local uri
	uri=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	echo "${uri:-http://deb.debian.org/debian}"
}

# base_layer_path: where the base layer of this suite, mirror and package
# list is (its name is the stamp: a hash of them).
base_layer_path() {
	local key
	key=$(echo "base/2 $DEBIAN_SUITE $(debian_mirror) $DEBIAN_PACKAGES" | sha256sum | cut -c1-12)
	echo "$WORK/debian-$DEBIAN_SUITE-$key.tar.gz"
}

# build_base_layer: debootstrap --variant=minbase with DEBIAN_PACKAGES, the
# agnhost user and group, tarred and gzip'd once into BASE_LAYER.
build_base_layer() {
	local mirror rootfs
	mirror=$(debian_mirror)
	[[ -s $BASE_LAYER ]] && return
	command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
	rootfs=$(mktemp -d "$WORK/rootfs.XXXXXX")
	# This runs in a background subshell: its EXIT trap removes the root
	# file system whether debootstrap succeeded or not (the log stays on
	# failure).
	# shellcheck disable=SC2064 # expanded now: rootfs is local
	trap "rm -rf '$rootfs'" EXIT
	log "debootstrap $DEBIAN_SUITE from $mirror (a few minutes)"
	# First stage: download and unpack only, in a private mount namespace.
	unshare --mount --propagation private -- \
		"${niceprefix[@]}" debootstrap --variant=minbase --foreign \
		--include="$DEBIAN_PACKAGES" "$DEBIAN_SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
		{ tail -20 "$rootfs.log" >&2; die "debootstrap failed (log: $rootfs.log)"; }
	# Second stage (configure) offline, in private mount, network and PID
	# namespaces, with services forbidden to start: nginx's postinst must
	# not listen anywhere, and nothing it starts may outlive the stage.
	printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
	chmod 755 "$rootfs/usr/sbin/policy-rc.d"
	unshare --mount --net --pid --fork --propagation private -- \
		"${niceprefix[@]}" chroot "$rootfs" /debootstrap/debootstrap --second-stage >>"$rootfs.log" 2>&1 ||
		{ tail -20 "$rootfs.log" >&2; die "debootstrap second stage failed (log: $rootfs.log)"; }
	finish_rootfs "$rootfs"
	tar --numeric-owner --xattrs --xattrs-include=security.capability --sort=name \
		--exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
		-C "$rootfs" -cf - . | gzip -1 >"$BASE_LAYER.tmp"
	mv -f "$BASE_LAYER.tmp" "$BASE_LAYER"
	rm -rf "$rootfs" "$rootfs.log"
}

# finish_rootfs: agnhost's user and group, nginx logging to the container's
# output as the nginx image does, and no host state (resolver, apt lists).
finish_rootfs() {
	local r=$1
	chroot "$r" groupadd -g 50000 group-defined-in-image
	chroot "$r" useradd -m -u 1000 -G group-defined-in-image user-defined-in-image
	ln -sf /dev/stdout "$r/var/log/nginx/access.log"
	ln -sf /dev/stderr "$r/var/log/nginx/error.log"
	rm -f "$r/usr/sbin/policy-rc.d" "$r/etc/hostname"
	: >"$r/etc/resolv.conf"
	: >"$r/etc/machine-id"
	rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
		"$r"/var/log/*.log "$r"/var/log/apt/* "$r"/tmp/* "$r"/root/.bash_history
}

# build_busybox_layer: a busybox image's tree (/bin with every applet, /etc
# with root and nobody, /tmp) from the machine's static busybox.
build_busybox_layer() {
	local bb tree applet
	bb=${KNP_IMAGES_BUSYBOX:-$(command -v busybox || true)}
	[[ -x $bb ]] || die "busybox not found (apt-get install busybox-static)"
	if ldd "$bb" >/dev/null 2>&1; then die "$bb is not static (apt-get install busybox-static)"; fi
	BUSYBOX_LAYER=$WORK/busybox.tar.gz
	tree=$WORK/busybox-tree
	rm -rf "$tree"
	mkdir -p "$tree/bin" "$tree/etc" "$tree/root" "$tree/tmp" "$tree/home" "$tree/var/www"
	chmod 1777 "$tree/tmp"
	chmod 700 "$tree/root"
	cp "$bb" "$tree/bin/busybox"
	for applet in $("$bb" --list); do
		[[ $applet == busybox ]] || ln -s busybox "$tree/bin/$applet"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$tree/etc/passwd"
	printf 'root:x:0:\nnobody:x:65534:\n' >"$tree/etc/group"
	"$TOOL" layer -out "$BUSYBOX_LAYER" -tree "/=$tree"
}

# build_coredns_layer: /coredns, shared by agnhost, glibc-dns-testing and
# the CoreDNS image.
build_coredns_layer() {
	COREDNS_LAYER=$WORK/coredns.tar.gz
	"$TOOL" layer -out "$COREDNS_LAYER" -file "/coredns=$COREDNS_BIN"
}

# --- images -------------------------------------------------------------

IMAGES_TXT=()
MISSING=()

# image FILE "REF..." TOOL_FLAGS...: builds $OUT/FILE and records its
# references for images.txt.
image() {
	local file=$1 refs=$2 ref args=()
	shift 2
	for ref in $refs; do
		args+=(-ref "$ref")
		IMAGES_TXT+=("$ref $file")
	done
	"$TOOL" build -out "$OUT/$file" "${args[@]}" "$@"
}

# input VAR DEFAULT: sets VAR to $KNP_IMAGES_<VAR> or DEFAULT; returns 1
# (and records it) when that is not an executable file.
input() {
	local var=$1 override="KNP_IMAGES_${1%_BIN}" path
	path=${!override:-$2}
	printf -v "$var" '%s' "$path"
	[[ -x $path ]] && return 0
	MISSING+=("$path")
	return 1
}

build_images() {
	local agnhost_ref agnhost_prev pause_ref kube_proxy_ref coredns_ref
	pause_ref=$(e2e_ref Pause)
	build_pause "${pause_ref##*:}"
	image pause.tar "$pause_ref" -file "/pause=$PAUSE_BIN" \
		-user 65535:65535 -entrypoint '["/pause"]'
	# agnhost's fake-registry-server serves /var/registry: upstream's image
	# holds registry.k8s.io/pause:3.10.2 there as pause:testing (the
	# LocalhostNodePorts e2e spec pulls it through a NodePort); ours, the
	# pause image above.
	"$TOOL" registry -archive "$OUT/pause.tar" -out "$WORK/registry" -name pause -tag testing

	# make image's archive, every blob as it is, under the names deploy/
	# and the cluster's kubeadm objects use (the nodes unpack linux/amd64).
	local ref tag_args=()
	for ref in "registry.local/kube-nftproxy:$KNP_VERSION" docker.io/library/kube-nftproxy:dev docker.io/library/kube-nftproxy:latest; do
		tag_args+=(-ref "$ref")
		IMAGES_TXT+=("$ref kube-nftproxy.tar")
	done
	"$TOOL" tag -in "$KNP_IMAGE" -out "$OUT/kube-nftproxy.tar" "${tag_args[@]}"

	image busybox.tar "$(e2e_ref BusyBox)" -layer "$BUSYBOX_LAYER" \
		-env "PATH=$DEBIAN_PATH" -cmd '["sh"]'

	image regression-issue-74839.tar "$(e2e_ref RegressionIssue74839)" -layer "$BASE_LAYER" \
		-file "/regression-issue-74839=$REGRESSION_BIN" -env "PATH=$DEBIAN_PATH" \
		-entrypoint '["/regression-issue-74839"]'

	image distroless-iptables.tar "$(e2e_ref DistrolessIptables)" -layer "$BASE_LAYER" \
		-env "PATH=$DEBIAN_PATH"

	# nginx:1.27 and 1.28 are the same server here (Debian's).
	image nginx.tar "$(e2e_ref Nginx) $(e2e_ref NginxNew)" -layer "$BASE_LAYER" \
		-env "PATH=$DEBIAN_PATH" -expose 80/tcp -stopsignal SIGQUIT \
		-cmd '["nginx", "-g", "daemon off;"]'

	if input COREDNS_BIN "$CLUSTER_BIN/coredns"; then
		build_coredns_layer
		coredns_ref=registry.k8s.io/coredns/$(kubeadm_const CoreDNSImageName):$(kubeadm_const CoreDNSVersion)
		image coredns.tar "$coredns_ref" -layer "$COREDNS_LAYER" \
			-expose 53/tcp -expose 53/udp -entrypoint '["/coredns"]'
		image glibc-dns-testing.tar "$(e2e_ref GlibcDnsTesting)" -layer "$BASE_LAYER" \
			-layer "$COREDNS_LAYER" -env "PATH=$DEBIAN_PATH" -cmd '["bash"]'
		if input AGNHOST_BIN "$K8S_BIN/agnhost"; then
			agnhost_ref=$(e2e_ref Agnhost)
			agnhost_prev=$(e2e_ref AgnhostPrev)
			image agnhost.tar "$agnhost_ref $agnhost_prev" -layer "$BASE_LAYER" -layer "$COREDNS_LAYER" \
				-file "/agnhost=$AGNHOST_BIN" -symlink /agnhost-2=agnhost -dir /uploads \
				-file "/localhost.crt=$K8S_DIR/test/images/agnhost/porter/localhost.crt" \
				-file "/localhost.key=$K8S_DIR/test/images/agnhost/porter/localhost.key" \
				-tree "/var/registry=$WORK/registry" \
				-env "PATH=$DEBIAN_PATH" -expose 80 -expose 8080 -expose 8081 -expose 9376 -expose 5000 \
				-entrypoint '["/agnhost"]' -cmd '["pause"]'
		fi
	fi

	kube_proxy_ref=registry.k8s.io/kube-proxy:$K8S_VERSION
	if input KUBE_PROXY_BIN "$K8S_BIN/kube-proxy"; then
		image kube-proxy.tar "$kube_proxy_ref" -layer "$BASE_LAYER" \
			-file "/usr/local/bin/kube-proxy=$KUBE_PROXY_BIN" -env "PATH=$DEBIAN_PATH"
	fi

	if input FLANNELD_BIN "$CLUSTER_BIN/flanneld"; then
		image flannel.tar "ghcr.io/flannel-io/flannel:$FLANNEL_VERSION" -layer "$BASE_LAYER" \
			-file "/opt/bin/flanneld=$FLANNELD_BIN" -file "/opt/bin/install-conf=$INSTALL_CONF_BIN" \
			-env "PATH=$DEBIAN_PATH" -entrypoint '["/opt/bin/flanneld"]'
	fi
	# Its init container runs `cp -f /flannel /opt/cni/bin/flannel`: cp
	# comes from the busybox layer.
	if input FLANNEL_CNI_BIN "$CLUSTER_BIN/cni/flannel"; then
		image flannel-cni-plugin.tar "ghcr.io/flannel-io/flannel-cni-plugin:$FLANNEL_CNI_TAG" \
			-layer "$BUSYBOX_LAYER" -file "/flannel=$FLANNEL_CNI_BIN" -env "PATH=$DEBIAN_PATH"
	fi
}

# MetalLB's controller and speaker, each its static binary alone, as its
# own images are (distroless static). Optional: see the header.
METALLB_VERSION=v0.16.1
build_metallb_images() {
	if [[ ${KNP_CLUSTER_LB:-} != metallb && ! -x ${KNP_IMAGES_METALLB_CONTROLLER:-$CLUSTER_BIN/metallb-controller} ]]; then
		return
	fi
	if input METALLB_CONTROLLER_BIN "$CLUSTER_BIN/metallb-controller"; then
		image metallb-controller.tar "quay.io/metallb/controller:$METALLB_VERSION" \
			-file "/controller=$METALLB_CONTROLLER_BIN" -entrypoint '["/controller"]'
	fi
	if input METALLB_SPEAKER_BIN "$CLUSTER_BIN/metallb-speaker"; then
		image metallb-speaker.tar "quay.io/metallb/speaker:$METALLB_VERSION" \
			-file "/speaker=$METALLB_SPEAKER_BIN" -entrypoint '["/speaker"]'
	fi
}

write_images_txt() {
	printf '%s\n' "${IMAGES_TXT[@]}" >"$OUT/images.txt.tmp"
	mv -f "$OUT/images.txt.tmp" "$OUT/images.txt"
}

# timed LABEL COMMAND...: runs COMMAND and prints how long it took.
timed() {
	local label=$1 start
	shift
	start=$(now)
	"$@"
	log "$label: $(since "$start")"
}

# debootstrap waits on the network and dpkg, the Go builds on the CPU: the
# base layer is built meanwhile.
BASE_LAYER=$(base_layer_path)
timed "Debian base layer" build_base_layer &
base_pid=$!
# Never leave debootstrap running behind a failed build.
trap 'wait' EXIT
timed "cluster-images tool" build_tool
timed "kube-nftproxy image (hack/image.sh)" build_kube_nftproxy
timed "regression-issue-74839 binary" build_regression_74839
timed "flannel install-conf binary" build_install_conf
wait "$base_pid" || die "building the Debian base layer failed"
timed "busybox layer" build_busybox_layer
timed "images" build_images
timed "MetalLB images" build_metallb_images
write_images_txt
log "total: $(since "$total_start"); $(wc -l <"$OUT/images.txt") references in $OUT/images.txt"
if ((${#MISSING[@]})); then
	log "left out, inputs missing (build them with hack/cluster/build.sh): ${MISSING[*]}" >&2
	exit 1
fi

#!/usr/bin/env bash
# Most functions run through with_lock "$@", which shellcheck cannot follow.
# shellcheck disable=SC2317
# Builds and caches every binary of the real two-node test cluster from Go
# modules (through the Go module proxy): nothing from Kubernetes, etcd,
# containerd, CoreDNS or flannel is kept in this repository.
#
#   hack/cluster/build.sh [PART...]   # build (or reuse) the parts, default all
#   hack/cluster/build.sh --print-dir # print $KNP_CACHE, build nothing
#   hack/cluster/build.sh --print NAME  # print a binary's path, build nothing
#
# PART is one of
#   all         everything below (metallb only with KNP_CLUSTER_LB=metallb)
#   k8s         kube-apiserver kube-controller-manager kube-scheduler kubelet
#               kubectl kube-proxy agnhost e2e.test -> $KNP_CACHE/k8s-VERSION/bin
#   one of those eight names: only that binary (hack/apiserver/build.sh and
#               hack/kube-proxy/build.sh use this, so CI builds just the two)
#   etcd        etcd (the version Kubernetes pins)  -> $KNP_CACHE/cluster/bin
#   containerd  containerd containerd-shim-runc-v2 ctr (+ Debian's runc)
#   coredns     coredns
#   flannel     flanneld, and the CNI plugins flannel bridge host-local
#               loopback portmap in cluster/bin/cni
#   ginkgo      the ginkgo CLI that runs e2e.test in parallel processes (the
#               version e2e.test links)
#   metallb     metallb-controller metallb-speaker (MetalLB, the optional
#               load balancer: KNP_CLUSTER_LB=metallb), and its CRDs from
#               the module in cluster/metallb/crds.yaml
#
# Each part is skipped when its outputs are cached and valid: every binary is
# there, was built from the same recipe (a stamp file records it) and, where
# the binary can tell, reports the expected version. Each output directory
# has a flock, so concurrent runs (make, CI, other scripts) build once.
#
# Environment:
#   KNP_CACHE       cache root (default /var/cache/kube-nftproxy)
#   KNP_K8S_VERSION k8s.io/kubernetes version (default v1.37.1)
#   KNP_BUILD_NICE  nice level of the compiles (default 10; 0 disables)
#   KNP_CLUSTER_LB  metallb: `all` builds the metallb part too
#
# All builds share one Go build cache, $KNP_CACHE/gocache, so packages used
# by several commands (client-go, apimachinery, grpc, ...) compile once.
set -euo pipefail

CACHE_ROOT=${KNP_CACHE:-/var/cache/kube-nftproxy}
K8S_VERSION=${KNP_K8S_VERSION:-v1.37.1}
NICE=${KNP_BUILD_NICE:-10}

# Pinned versions. ETCD_VERSION is the etcd k8s.io/kubernetes v1.37.1 is
# built and tested with: its go.mod requires go.etcd.io/etcd/server/v3
# v3.7.0, build/dependencies.yaml says 3.7.0 and kubeadm's DefaultEtcdVersion
# 3.7.0-0. build_etcd warns when the downloaded go.mod says otherwise.
ETCD_VERSION=v3.7.0
# GINKGO_VERSION is the ginkgo k8s.io/kubernetes v1.37.1 (so e2e.test)
# links: its parallel runner must speak the same protocol.
GINKGO_VERSION=v2.32.0
CONTAINERD_VERSION=v2.4.2
CONTAINERD_TAGS="no_btrfs no_devmapper no_zfs no_aufs"
COREDNS_VERSION=v1.15.0
FLANNEL_VERSION=v0.28.10
CNI_PLUGINS_VERSION=v1.10.0
# MetalLB v0.16.1, not v0.16.2: v0.16.2 requires github.com/metallb/frr-k8s
# v0.0.27, whose zip the module proxy refuses (403 "This module version is
# not available"), and does not compile against v0.0.26, the newest served
# (its frr-k8s backend uses API types added in v0.0.27). v0.16.1 requires
# v0.0.25, which is served: the release builds unmodified.
METALLB_VERSION=v0.16.1

# Bump RECIPE when a change to this script (flags, ldflags, tags) must
# rebuild binaries whose versions did not change.
RECIPE=1

K8S_DIR=$CACHE_ROOT/k8s-$K8S_VERSION
K8S_BIN=$K8S_DIR/bin
CLUSTER_DIR=$CACHE_ROOT/cluster
CLUSTER_BIN=$CLUSTER_DIR/bin
K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)
K8S_ALL=("${K8S_COMMANDS[@]}" agnhost e2e.test)
K8S_MODULE_DIR= # set by k8s_module: where the k8s.io/kubernetes module is unpacked

log() { echo "cluster/build.sh: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# ---------------------------------------------------------------------------
# Shared machinery

# go_env sets the environment every build uses: the local toolchain only
# (nothing but the module proxy is reachable), module mode without a
# workspace, static binaries, and the one shared build cache.
go_env() {
	command -v go >/dev/null || die "go not found in PATH"
	export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
	export GOCACHE=$CACHE_ROOT/gocache
	mkdir -p "$GOCACHE"
}

# niced runs a command at the build's nice level: two cores are shared.
niced() {
	if [[ $NICE != 0 ]] && command -v nice >/dev/null; then
		nice -n "$NICE" "$@"
	else
		"$@"
	fi
}

# stamp_key is what a cached binary must have been built from: the part's
# versions and tags, this script's recipe revision and the Go version, so a
# version bump, a new toolchain or a changed recipe rebuilds.
stamp_key() { echo "$1 r$RECIPE $(go env GOVERSION)"; }

# stamped DIR NAME KEY: NAME in DIR is executable and was built from KEY.
stamped() {
	[[ -x $1/$2 ]] && grep -qxF "$2 $3" "$1/.stamps" 2>/dev/null
}

# stamp DIR NAME KEY records that NAME was built from KEY. Parts of
# cluster/bin build under separate locks but share its stamp file, hence
# the lock around the rewrite.
stamp() {
	local f=$1/.stamps
	(
		flock 8
		touch "$f"
		awk -v name="$2" '$1 != name' "$f" >"$f.tmp"
		echo "$2 $3" >>"$f.tmp"
		mv -f "$f.tmp" "$f"
	) 8>>"$1/.stamps.lock"
}

# reports VERSION CMD...: CMD runs and prints VERSION (a cheap sanity check
# that the cached binary is intact and the version stamping worked).
reports() {
	local want=$1 out
	shift
	out=$("$@" 2>&1) || return 1
	grep -qF -- "$want" <<<"$out"
}

# with_lock DIR FUNC ARGS...: run FUNC holding DIR/.lock.
with_lock() {
	local dir=$1
	shift
	mkdir -p "$dir"
	(
		flock 9
		"$@"
	) 9>"$dir/.lock"
}

# helper_module DIR MODULE_LINE REQUIRE...: writes a go.mod in DIR (kept
# across builds so go.sum need not be resolved again).
helper_module() {
	local dir=$1 name=$2
	shift 2
	mkdir -p "$dir"
	{
		echo "module knp.local/$name"
		echo
		echo "go $(go env GOVERSION | sed 's/^go//')"
		echo
		for r in "$@"; do echo "require $r"; done
	} >"$dir/go.mod.new"
	# Keep go.sum only when the requirements did not change.
	if ! cmp -s "$dir/go.mod.new" "$dir/go.mod.in" 2>/dev/null; then
		rm -f "$dir/go.sum"
		cp "$dir/go.mod.new" "$dir/go.mod.in"
	fi
	mv -f "$dir/go.mod.new" "$dir/go.mod"
}

timed() {
	local what=$1 start=$SECONDS
	shift
	"$@"
	log "$what: $((SECONDS - start)) s"
}

# ---------------------------------------------------------------------------
# Kubernetes: one helper module, one go build for the six commands and
# agnhost, then go test -c for e2e.test, all from the same build cache.

# k8s_ldflags prints the version stamps; k8s_module must have run (it sets
# K8S_MODULE_DIR).
k8s_ldflags() {
	local minor p flags="-s -w"
	minor=$(echo "$K8S_VERSION" | cut -d. -f2)
	# kubectl's client version comes from client-go, the rest from
	# component-base; e2e.test and kubelet compare them with the server's.
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		flags+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	done
	# agnhost's main.Version (the other main packages have none).
	flags+=" -X main.Version=$(cat "$K8S_MODULE_DIR/test/images/agnhost/VERSION")"
	echo "$flags"
}

k8s_valid() {
	local name=$1
	stamped "$K8S_BIN" "$name" "$(stamp_key "k8s $K8S_VERSION")" || return 1
	case $name in
	kubectl) reports "$K8S_VERSION" "$K8S_BIN/kubectl" version --client ;;
	e2e.test) reports "$K8S_VERSION" "$K8S_BIN/e2e.test" --version ;;
	# agnhost has its own version (test/images/agnhost/VERSION), which
	# k8s_ldflags stamps; unstamped it says "development".
	agnhost) reports " version " "$K8S_BIN/agnhost" --version &&
		! reports development "$K8S_BIN/agnhost" --version ;;
	*) reports "Kubernetes $K8S_VERSION" "$K8S_BIN/$name" --version ;;
	esac
}

# k8s_module writes the helper module: k8s.io/kubernetes is not meant to be
# a dependency (its go.mod requires every staging module at v0.0.0 and
# replaces it with ./staging/src/..., absent from the module zip), so each
# staging module is replaced by its published v0.X.Y tag instead.
k8s_module() {
	local dir=$K8S_DIR/module json gomod replaced required staging
	local staging_version=v0.${K8S_VERSION#v1.}
	helper_module "$dir" "k8s-$K8S_VERSION" "k8s.io/kubernetes $K8S_VERSION"
	json=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
	gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' <<<"$json")
	K8S_MODULE_DIR=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$json")
	[[ -n $gomod && -f $gomod && -d $K8S_MODULE_DIR ]] ||
		die "could not download k8s.io/kubernetes@$K8S_VERSION"
	replaced=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$gomod" | sort -u)
	required=$(awk '/^require[[:space:]]*\(/ { inreq = 1; next }
		inreq && /^\)/ { inreq = 0; next }
		inreq && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
	staging=$(comm -12 <(echo "$replaced") <(echo "$required"))
	[[ -n $staging ]] || die "found no staging modules in $gomod"
	{
		echo
		echo "replace ("
		for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"; done
		echo ")"
	} >>"$dir/go.mod"
	log "k8s: helper module replaces $(echo "$staging" | wc -l) staging modules with $staging_version"
}

# build_k8s NAME...: builds those of the named binaries that are not cached.
build_k8s() {
	local name todo=() pkgs=() ldflags dir=$K8S_DIR/module tmp=$K8S_DIR/tmp
	for name in "$@"; do k8s_valid "$name" || todo+=("$name"); done
	if ((${#todo[@]} == 0)); then
		log "k8s: cached in $K8S_BIN ($*)"
		return
	fi
	log "k8s $K8S_VERSION: building ${todo[*]} (cold on 2 cores: 5 min for one command, 16 for all; seconds with a warm build cache)"
	k8s_module
	ldflags=$(k8s_ldflags)
	rm -rf "$tmp" && mkdir -p "$tmp" "$K8S_BIN"
	for name in "${todo[@]}"; do
		case $name in
		agnhost) pkgs+=(k8s.io/kubernetes/test/images/agnhost) ;;
		e2e.test) ;;
		*) pkgs+=("k8s.io/kubernetes/cmd/$name") ;;
		esac
	done
	if ((${#pkgs[@]} > 0)); then
		# With -o DIR/ one go build writes every main package: shared
		# packages are compiled once for all of them.
		timed "k8s: go build ${pkgs[*]##*/}" \
			niced go -C "$dir" build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
	fi
	if [[ " ${todo[*]} " == *" e2e.test "* ]]; then
		# -vet=off: go test -c would otherwise vet all of test/e2e's
		# packages, minutes of CPU for code we do not change.
		timed "k8s: go test -c e2e.test" \
			niced go -C "$dir" test -c -vet=off -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
	fi
	for name in "${todo[@]}"; do
		mv -f "$tmp/$name" "$K8S_BIN/$name"
		stamp "$K8S_BIN" "$name" "$(stamp_key "k8s $K8S_VERSION")"
		k8s_valid "$name" || die "k8s: $K8S_BIN/$name fails its version check"
	done
	rm -rf "$tmp"
	log "k8s: built ${todo[*]} in $K8S_BIN"
}

# ---------------------------------------------------------------------------
# The cluster's other binaries: each from its own helper module (their
# dependency graphs differ), into $CLUSTER_BIN, sharing the build cache.

# go_build_into PART OUTDIR GO_BUILD_ARGS...: one go build in the
# part's helper module ($CLUSTER_DIR/src/PART), into a scratch directory.
go_build_into() {
	local part=$1 out=$2
	shift 2
	rm -rf "$out" && mkdir -p "$out"
	timed "$part: go build" niced go -C "$CLUSTER_DIR/src/$part" build -trimpath "$@"
}

# install_outputs TMP KEY NAME...: moves TMP/NAME to cluster/bin/NAME (NAME
# may be a path, e.g. cni/bridge), stamps it, and removes TMP.
install_outputs() {
	local tmp=$1 key=$2 name
	shift 2
	for name in "$@"; do
		mkdir -p "$(dirname "$CLUSTER_BIN/$name")"
		mv -f "$tmp/$name" "$CLUSTER_BIN/$name"
		stamp "$CLUSTER_BIN" "$name" "$key"
	done
	rm -rf "$tmp"
}

# all_stamped KEY NAME...: every NAME in cluster/bin was built from KEY.
all_stamped() {
	local key=$1 name
	shift
	for name in "$@"; do stamped "$CLUSTER_BIN" "$name" "$key" || return 1; done
}

etcd_valid() {
	all_stamped "$(stamp_key "etcd $ETCD_VERSION")" etcd &&
		reports "etcd Version: ${ETCD_VERSION#v}" "$CLUSTER_BIN/etcd" --version
}

# build_etcd builds the etcd server Kubernetes is tested with (its go.mod
# requires go.etcd.io/etcd/server/v3 at that version; kubeadm's
# DefaultEtcdVersion agrees), not Debian's 3.4 that the API tests use.
build_etcd() {
	local tmp=$CLUSTER_DIR/tmp-etcd pinned
	etcd_valid && log "etcd: cached $CLUSTER_BIN/etcd" && return
	pinned=$(k8s_pinned_etcd)
	if [[ -n $pinned && $pinned != "$ETCD_VERSION" ]]; then
		log "etcd: warning: k8s.io/kubernetes $K8S_VERSION requires etcd $pinned, building $ETCD_VERSION"
	fi
	helper_module "$CLUSTER_DIR/src/etcd" etcd "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
	go_build_into etcd "$tmp" -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
		-o "$tmp/etcd" go.etcd.io/etcd/server/v3
	install_outputs "$tmp" "$(stamp_key "etcd $ETCD_VERSION")" etcd
	etcd_valid || die "etcd: $CLUSTER_BIN/etcd does not report $ETCD_VERSION"
	log "etcd: built $CLUSTER_BIN/etcd"
}

# k8s_pinned_etcd prints the etcd server version in k8s.io/kubernetes'
# go.mod when that module is already downloaded (nothing otherwise).
k8s_pinned_etcd() {
	local gomod
	gomod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod
	[[ -f $gomod ]] && awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$gomod"
	true
}

ginkgo_valid() {
	all_stamped "$(stamp_key "ginkgo $GINKGO_VERSION")" ginkgo &&
		reports "${GINKGO_VERSION#v}" "$CLUSTER_BIN/ginkgo" version
}

# build_ginkgo builds the ginkgo CLI, which runs e2e.test's specs in
# parallel processes (the cluster tier and make conformance).
build_ginkgo() {
	local tmp=$CLUSTER_DIR/tmp-ginkgo
	ginkgo_valid && log "ginkgo: cached $CLUSTER_BIN/ginkgo" && return
	helper_module "$CLUSTER_DIR/src/ginkgo" ginkgo "github.com/onsi/ginkgo/v2 $GINKGO_VERSION"
	go_build_into ginkgo "$tmp" -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
	install_outputs "$tmp" "$(stamp_key "ginkgo $GINKGO_VERSION")" ginkgo
	ginkgo_valid || die "ginkgo: $CLUSTER_BIN/ginkgo does not report $GINKGO_VERSION"
	log "ginkgo: built $CLUSTER_BIN/ginkgo"
}

containerd_valid() {
	local v=${CONTAINERD_VERSION#v}
	all_stamped "$(stamp_key "containerd $CONTAINERD_VERSION $CONTAINERD_TAGS")" \
		containerd containerd-shim-runc-v2 ctr &&
		reports "$v" "$CLUSTER_BIN/containerd" --version &&
		reports "$v" "$CLUSTER_BIN/ctr" --version &&
		reports "$v" "$CLUSTER_BIN/containerd-shim-runc-v2" -v
}

# build_containerd builds containerd 2 with its own runc shim (Debian's 1.6
# shim cannot serve containerd 2). The tags drop snapshotters that need cgo
# or kernel features this machine lacks; overlayfs stays.
build_containerd() {
	local tmp=$CLUSTER_DIR/tmp-containerd m=github.com/containerd/containerd/v2
	# The shim runs runc from PATH; Debian's (1.1) serves containerd 2.
	ensure_package runc runc
	containerd_valid && log "containerd: cached in $CLUSTER_BIN" && return
	helper_module "$CLUSTER_DIR/src/containerd" containerd "$m $CONTAINERD_VERSION"
	go_build_into containerd "$tmp" -tags "$CONTAINERD_TAGS" \
		-ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Revision=$CONTAINERD_VERSION" \
		-o "$tmp/" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
	install_outputs "$tmp" "$(stamp_key "containerd $CONTAINERD_VERSION $CONTAINERD_TAGS")" \
		containerd containerd-shim-runc-v2 ctr
	containerd_valid || die "containerd: the binaries do not report $CONTAINERD_VERSION"
	log "containerd: built containerd containerd-shim-runc-v2 ctr in $CLUSTER_BIN"
}

# ensure_package CMD PKG...: installs Debian's PKGs when CMD is missing, the
# way .ci/run installs the tests' packages.
ensure_package() {
	local cmd=$1
	shift
	command -v "$cmd" >/dev/null && return
	log "installing Debian's $*"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -qq --no-install-recommends "$@"; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "$@"
	fi
}

coredns_valid() {
	all_stamped "$(stamp_key "coredns $COREDNS_VERSION")" coredns &&
		reports "CoreDNS-${COREDNS_VERSION#v}" "$CLUSTER_BIN/coredns" -version
}

# build_coredns builds CoreDNS with its default plugin set (its own
# plugin.cfg, already generated in the module).
build_coredns() {
	local tmp=$CLUSTER_DIR/tmp-coredns m=github.com/coredns/coredns
	coredns_valid && log "coredns: cached $CLUSTER_BIN/coredns" && return
	helper_module "$CLUSTER_DIR/src/coredns" coredns "$m $COREDNS_VERSION"
	go_build_into coredns "$tmp" -ldflags "-s -w -X $m/coremain.GitCommit=$COREDNS_VERSION" \
		-o "$tmp/coredns" "$m"
	install_outputs "$tmp" "$(stamp_key "coredns $COREDNS_VERSION")" coredns
	coredns_valid || die "coredns: $CLUSTER_BIN/coredns does not report $COREDNS_VERSION"
	log "coredns: built $CLUSTER_BIN/coredns"
}

CNI_REFERENCE=(bridge host-local loopback portmap)
# The flannel CNI plugin's own repository (github.com/flannel-io/cni-plugin)
# is refused by the module proxy (403 "This module version is not
# available", every version), so it comes from where flannel-io forked it:
# plugins/meta/flannel in containernetworking/plugins, last shipped in
# v0.9.1. It only reads flanneld's subnet.env and hands a bridge +
# host-local config to the bridge plugin built above.
CNI_FLANNEL_MODULE_VERSION=v0.9.1

# flanneld links every backend, tencent-vpc too, and the module proxy
# serves only the .mod of the tencentcloud vpc SDK version flannel requires
# (v1.3.188: its zip is refused with 403), so the build pins v1.0.1000, whose
# zip is served and whose vpc/v20170312 API the backend compiles against.
# The cluster uses the vxlan backend; tencent-vpc is never run.
TENCENT_VPC=github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc
TENCENT_VPC_VERSION=v1.0.1000

FLANNELD_TAGS="netgo osusergo"

flannel_key() { stamp_key "flannel $FLANNEL_VERSION $FLANNELD_TAGS vpc $TENCENT_VPC_VERSION cni $CNI_PLUGINS_VERSION flannel-cni $CNI_FLANNEL_MODULE_VERSION"; }

flannel_valid() {
	all_stamped "$(flannel_key)" flanneld cni/flannel "${CNI_REFERENCE[@]/#/cni/}" &&
		reports "$FLANNEL_VERSION" "$CLUSTER_BIN/flanneld" --version &&
		cni_reports bridge "$CNI_PLUGINS_VERSION" &&
		cni_reports flannel "$CNI_FLANNEL_MODULE_VERSION"
}

# cni_reports NAME VERSION: a CNI plugin run without CNI_COMMAND prints
# "CNI NAME plugin VERSION" (and exits non-zero). Its output is read whole:
# piped into grep -q under pipefail, the plugin could die of SIGPIPE once grep
# had its match, and a valid build would be refused.
cni_reports() {
	local out
	out=$(env -u CNI_COMMAND "$CLUSTER_BIN/cni/$1" 2>&1) || true
	[[ $out == *"$2"* ]]
}

# build_flannel builds flanneld (the cluster uses its vxlan backend) and the
# CNI plugins: flannel delegates to bridge + host-local, portmap
# serves hostPort, loopback the pods' lo.
build_flannel() {
	local tmp=$CLUSTER_DIR/tmp-flannel p=github.com/containernetworking/plugins
	local bv=pkg/utils/buildversion.BuildVersion
	flannel_valid && log "flannel: cached in $CLUSTER_BIN" && return
	helper_module "$CLUSTER_DIR/src/flannel" flannel "github.com/flannel-io/flannel $FLANNEL_VERSION"
	echo "replace $TENCENT_VPC => $TENCENT_VPC $TENCENT_VPC_VERSION" >>"$CLUSTER_DIR/src/flannel/go.mod"
	# flanneld needs cgo on amd64: main links every backend, and the udp
	# backend's amd64 code calls its C proxy (pkg/backend/udp/cproxy_amd64.go),
	# so CGO_ENABLED=0 fails with "undefined: runCProxy". Linked statically,
	# as flannel's own Makefile does, so it runs anywhere; netgo and osusergo
	# keep name and user lookups in Go, not in glibc's NSS, which a static
	# binary cannot load.
	ensure_package gcc gcc libc6-dev
	CGO_ENABLED=1 go_build_into flannel "$tmp" -tags "$FLANNELD_TAGS" \
		-ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION -extldflags -static" \
		-o "$tmp/flanneld" github.com/flannel-io/flannel
	helper_module "$CLUSTER_DIR/src/cni" cni "$p $CNI_PLUGINS_VERSION"
	go_build_into cni "$tmp/cni" -ldflags "-s -w -X $p/$bv=$CNI_PLUGINS_VERSION" -o "$tmp/cni/" \
		"$p/plugins/main/bridge" "$p/plugins/ipam/host-local" \
		"$p/plugins/main/loopback" "$p/plugins/meta/portmap"
	helper_module "$CLUSTER_DIR/src/cni-flannel" cni-flannel "$p $CNI_FLANNEL_MODULE_VERSION"
	go_build_into cni-flannel "$tmp/cni-flannel" \
		-ldflags "-s -w -X $p/$bv=$CNI_FLANNEL_MODULE_VERSION" \
		-o "$tmp/cni-flannel/flannel" "$p/plugins/meta/flannel"
	mv "$tmp/cni-flannel/flannel" "$tmp/cni/flannel"
	install_outputs "$tmp" "$(flannel_key)" flanneld cni/flannel "${CNI_REFERENCE[@]/#/cni/}"
	flannel_valid || die "flannel: the binaries do not report their versions"
	log "flannel: built flanneld and cni/{flannel,${CNI_REFERENCE[*]}} in $CLUSTER_BIN"
}

# MetalLB (L2 mode) for KNP_CLUSTER_LB=metallb: its controller and speaker
# from go.universe.tf/metallb, and the module's own CRDs, the ones matching
# these binaries (config/crd/bases), concatenated into one file that the
# cluster applies. Nothing of MetalLB is kept in this repository.
METALLB_CRDS=$CLUSTER_DIR/metallb/crds.yaml
METALLB_KINDS=(ipaddresspools l2advertisements bgpadvertisements bgppeers bfdprofiles communities
	servicel2statuses servicebgpstatuses configurationstates)

metallb_key() { stamp_key "metallb $METALLB_VERSION"; }

# metallb_valid: both binaries stamped and linked from the pinned module
# (neither has a --version flag; `go version -m` reads the build info), and
# the CRDs written from the same version.
metallb_valid() {
	local b
	all_stamped "$(metallb_key)" metallb-controller metallb-speaker || return 1
	for b in metallb-controller metallb-speaker; do
		reports "go.universe.tf/metallb	$METALLB_VERSION" go version -m "$CLUSTER_BIN/$b" || return 1
	done
	grep -qxF "# $(metallb_key)" "$METALLB_CRDS" 2>/dev/null
}

build_metallb() {
	local tmp=$CLUSTER_DIR/tmp-metallb m=go.universe.tf/metallb dir kind
	metallb_valid && log "metallb: cached in $CLUSTER_BIN" && return
	helper_module "$CLUSTER_DIR/src/metallb" metallb "$m $METALLB_VERSION"
	go_build_into metallb "$tmp" -ldflags "-s -w -X $m/internal/version.gitCommit=$METALLB_VERSION" \
		-o "$tmp/" "$m/controller" "$m/speaker"
	mv "$tmp/controller" "$tmp/metallb-controller"
	mv "$tmp/speaker" "$tmp/metallb-speaker"
	dir=$(go -C "$CLUSTER_DIR/src/metallb" list -m -f '{{.Dir}}' "$m")
	[[ -d $dir/config/crd/bases ]] || die "metallb: no config/crd/bases in $dir"
	mkdir -p "$(dirname "$METALLB_CRDS")"
	{
		echo "# $(metallb_key)"
		for kind in "${METALLB_KINDS[@]}"; do
			echo "---"
			cat "$dir/config/crd/bases/metallb.io_$kind.yaml"
		done
	} >"$METALLB_CRDS.tmp"
	install_outputs "$tmp" "$(metallb_key)" metallb-controller metallb-speaker
	mv -f "$METALLB_CRDS.tmp" "$METALLB_CRDS"
	metallb_valid || die "metallb: the binaries do not carry $m $METALLB_VERSION"
	log "metallb: built metallb-controller metallb-speaker in $CLUSTER_BIN, CRDs in $METALLB_CRDS"
}

# ---------------------------------------------------------------------------
# main

# bin_path NAME prints where NAME is cached.
bin_path() {
	case $1 in
	kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl | kube-proxy | agnhost | e2e.test)
		echo "$K8S_BIN/$1"
		;;
	etcd | containerd | containerd-shim-runc-v2 | ctr | coredns | flanneld | ginkgo | metallb-controller | metallb-speaker | cni/*)
		echo "$CLUSTER_BIN/$1"
		;;
	*) die "--print: unknown binary '$1'" ;;
	esac
}

usage() {
	sed -n '/^# Builds and caches/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
}

main() {
	local parts=("$@") part
	((${#parts[@]} > 0)) || parts=(all)
	case ${parts[0]} in
	--print-dir)
		echo "$CACHE_ROOT"
		return
		;;
	--print)
		bin_path "${parts[1]:-}"
		return
		;;
	-h | --help) usage ;;
	esac
	case $K8S_VERSION in
	v1.*.*) ;;
	*) die "KNP_K8S_VERSION must look like v1.X.Y, got $K8S_VERSION" ;;
	esac
	go_env
	for part in "${parts[@]}"; do
		case $part in
		all)
			main k8s etcd containerd coredns flannel ginkgo
			if [[ ${KNP_CLUSTER_LB:-} == metallb ]]; then main metallb; fi
			;;
		k8s) with_lock "$K8S_DIR" build_k8s "${K8S_ALL[@]}" ;;
		kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kubectl | kube-proxy | agnhost | e2e.test)
			with_lock "$K8S_DIR" build_k8s "$part"
			;;
		etcd | containerd | coredns | flannel | ginkgo | metallb)
			with_lock "$CLUSTER_DIR/locks/$part" "build_$part"
			;;
		*) log "unknown part $part" && usage ;;
		esac
	done
}

# "; exit" on the same line: bash reads a script as it runs it, so a build
# that outlives an edit (or a git checkout) of this file stops here cleanly.
main "$@"; exit

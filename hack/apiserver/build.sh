#!/usr/bin/env bash
# Builds a real Kubernetes command (kube-apiserver by default; kube-proxy for
# the side-by-side tests, see hack/kube-proxy/build.sh) from the
# k8s.io/kubernetes Go module (through the Go module proxy), and caches it.
#
#   hack/apiserver/build.sh            # build (or reuse) the cached binary
#   hack/apiserver/build.sh --print    # print the binary's path, build nothing
#
# Environment:
#   KNP_CACHE            cache root (default /var/cache/kube-nftproxy)
#   KNP_K8S_CMD          command under k8s.io/kubernetes/cmd (default kube-apiserver)
#   KNP_K8S_VERSION      k8s.io/kubernetes version (default v1.36.3)
#   KNP_BUILD_NICE       nice level for the compile (default 10; 0 disables)
#
# The binary lands in $KNP_CACHE/$KNP_K8S_CMD-$KNP_K8S_VERSION/$KNP_K8S_CMD
# and the build is skipped when it is already there. No Kubernetes code is
# kept in this repository: the module is built in a temporary directory.
#
# k8s.io/kubernetes is not meant to be consumed as a module: its go.mod
# requires every staging module (k8s.io/api, k8s.io/apiserver, ...) at
# v0.0.0 and replaces them with ./staging/src/... directories that are not in
# the module zip. The helper go.mod below replaces each of them with the
# published staging module at the matching v0.X.Y instead.
set -euo pipefail

K8S_CMD=${KNP_K8S_CMD:-kube-apiserver}
K8S_VERSION=${KNP_K8S_VERSION:-v1.36.3}
CACHE_ROOT=${KNP_CACHE:-/var/cache/kube-nftproxy}
OUT_DIR=$CACHE_ROOT/$K8S_CMD-$K8S_VERSION
BIN=$OUT_DIR/$K8S_CMD
NICE=${KNP_BUILD_NICE:-10}

if [[ ${1:-} == --print ]]; then
	echo "$BIN"
	exit 0
fi

case $K8S_CMD in
kube-apiserver | kube-proxy) ;;
*)
	echo "build.sh: KNP_K8S_CMD must be kube-apiserver or kube-proxy, got $K8S_CMD" >&2
	exit 2
	;;
esac
case $K8S_VERSION in
v1.*.*) ;;
*)
	echo "build.sh: KNP_K8S_VERSION must look like v1.X.Y, got $K8S_VERSION" >&2
	exit 2
	;;
esac
# v1.36.3 -> v0.36.3 (staging modules are tagged v0.X.Y for Kubernetes v1.X.Y).
STAGING_VERSION=v0.${K8S_VERSION#v1.}

have_binary() {
	[[ -x $BIN ]] && "$BIN" --version >/dev/null 2>&1
}

if have_binary; then
	echo "build.sh: using cached $BIN ($("$BIN" --version))"
	exit 0
fi

command -v go >/dev/null || {
	echo "build.sh: go not found in PATH" >&2
	exit 1
}

mkdir -p "$OUT_DIR"
# One build at a time per version (make test and CI may race).
exec 9>"$OUT_DIR/.lock"
flock 9
if have_binary; then
	echo "build.sh: using cached $BIN (built by a concurrent run)"
	exit 0
fi

start=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/knp-$K8S_CMD-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

echo "build.sh: go $(go env GOVERSION), k8s.io/kubernetes $K8S_VERSION, staging $STAGING_VERSION"
echo "build.sh: downloading k8s.io/kubernetes@$K8S_VERSION go.mod"
gomod=$(cd "$WORK" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -n $gomod && -f $gomod ]] || {
	echo "build.sh: could not download k8s.io/kubernetes@$K8S_VERSION" >&2
	exit 1
}

# Staging modules: the k8s.io/* modules kubernetes' go.mod replaces with
# ./staging/src/... and requires at v0.0.0.
replaced=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$gomod" | sort -u)
required=$(awk '/^require[[:space:]]*\(/ { inreq = 1; next }
	inreq && /^\)/ { inreq = 0; next }
	inreq && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
staging=$(comm -12 <(echo "$replaced") <(echo "$required"))
[[ -n $staging ]] || {
	echo "build.sh: found no staging modules in $gomod" >&2
	exit 1
}

{
	echo "module knp.local/$K8S_CMD-build"
	echo
	echo "go $(go env GOVERSION | sed 's/^go//')"
	echo
	echo "require k8s.io/kubernetes $K8S_VERSION"
	echo
	echo "replace ("
	for m in $staging; do
		printf '\t%s => %s %s\n' "$m" "$m" "$STAGING_VERSION"
	done
	echo ")"
} >"$WORK/go.mod"
echo "build.sh: helper go.mod replaces $(echo "$staging" | wc -l) staging modules with $STAGING_VERSION"

pkg=k8s.io/component-base/version
ldflags="-s -w"
ldflags+=" -X $pkg.gitVersion=$K8S_VERSION"
ldflags+=" -X $pkg.gitMajor=1"
ldflags+=" -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
ldflags+=" -X $pkg.gitTreeState=clean"
ldflags+=" -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"

niceprefix=()
if [[ $NICE != 0 ]] && command -v nice >/dev/null; then
	niceprefix=(nice -n "$NICE")
fi

echo "build.sh: building k8s.io/kubernetes/cmd/$K8S_CMD (several minutes on 2 cores)"
(
	cd "$WORK"
	"${niceprefix[@]}" go build -trimpath -ldflags "$ldflags" \
		-o "$BIN.tmp" "k8s.io/kubernetes/cmd/$K8S_CMD"
)
mv -f "$BIN.tmp" "$BIN"
"$BIN" --version
end=$(date +%s)
echo "build.sh: built $BIN in $((end - start))s"

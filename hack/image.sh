#!/usr/bin/env bash
# Builds kube-nftproxy's container image without a container engine (make
# image): the static binary for each platform, stamped as make build
# stamps it, at /kube-nftproxy, /usr/local/bin/kube-proxy a symlink to it
# (kubeadm's DaemonSet runs that path), nothing else. Written as one OCI
# image layout archive holding an index of the platforms, by
# hack/cluster/images' tool; the last line printed is the index's digest.
#
# The same commit gives the same bytes: -trimpath, files dated
# SOURCE_DATE_EPOCH (default: the commit's time), owned by root, sorted.
#
# Environment: VERSION (default hack/version.sh), COMMIT (git rev-parse
# HEAD), IMAGE (name, default kube-nftproxy; tagged :VERSION), IMAGE_OUT
# (default bin/kube-nftproxy-image.tar), IMAGE_PLATFORMS (default
# "linux/amd64 linux/arm64"; the first is the one manifest.json gives
# docker load's classic store), GO (default go), SOURCE_DATE_EPOCH.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
GO=${GO:-go}
VERSION=${VERSION:-$(hack/version.sh)}
COMMIT=${COMMIT:-$(git rev-parse HEAD)}
IMAGE=${IMAGE:-kube-nftproxy}
IMAGE_OUT=${IMAGE_OUT:-bin/kube-nftproxy-image.tar}
IMAGE_PLATFORMS=${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
work=bin/image
mkdir -p "$work" "$(dirname "$IMAGE_OUT")"

platforms=()
for p in $IMAGE_PLATFORMS; do
	os=${p%%/*} arch=${p#*/}
	# -s: no symbol table in the image (panics still print their stacks).
	CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$GO" build -trimpath -buildvcs=false \
		-ldflags "-s -X main.release=$VERSION -X main.commit=$COMMIT" \
		-o "$work/$os-$arch/kube-nftproxy" ./cmd/kube-nftproxy
	platforms+=(-platform "$p")
done
(cd hack/cluster/images && GOWORK=off GOFLAGS=-mod=mod "$GO" build -trimpath -o "$repo/$work/cluster-images" .)

"$work/cluster-images" build -format oci -out "$IMAGE_OUT" -ref "$IMAGE:$VERSION" "${platforms[@]}" \
	-epoch "$SOURCE_DATE_EPOCH" -file "/kube-nftproxy=$work/{os}-{arch}/kube-nftproxy" \
	-symlink /usr/local/bin/kube-proxy=/kube-nftproxy -entrypoint '["/kube-nftproxy"]' \
	-label "org.opencontainers.image.version=$VERSION" -label "org.opencontainers.image.revision=$COMMIT" \
	-label org.opencontainers.image.source=https://github.com/kube-nftproxy/kube-nftproxy \
	-label org.opencontainers.image.licenses=Apache-2.0 >&2
echo "$IMAGE_OUT $IMAGE:$VERSION ($IMAGE_PLATFORMS) $("$work/cluster-images" digest "$IMAGE_OUT")"

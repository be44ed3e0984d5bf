#!/usr/bin/env bash
# Builds (or reuses) the real kube-apiserver the API tests run (e2e/apiserver):
# the Kubernetes part of hack/cluster/build.sh, which builds every
# Kubernetes binary from one helper module with one Go build cache, so this
# binary, upstream kube-proxy (hack/kube-proxy/build.sh) and the cluster's
# binaries share their compiled packages.
#
#   hack/apiserver/build.sh            # build (or reuse) the cached binary
#   hack/apiserver/build.sh --print    # print the binary's path, build nothing
#
# The binary is $KNP_CACHE/k8s-$KNP_K8S_VERSION/bin/kube-apiserver (default
# /var/cache/kube-nftproxy/k8s-v1.37.1/bin/kube-apiserver). KNP_CACHE,
# KNP_K8S_VERSION and KNP_BUILD_NICE are as for hack/cluster/build.sh.
set -euo pipefail
cluster=$(dirname "$0")/../cluster/build.sh
if [[ ${1:-} == --print ]]; then
	exec "$cluster" --print kube-apiserver
fi
exec "$cluster" kube-apiserver

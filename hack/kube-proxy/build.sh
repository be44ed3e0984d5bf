#!/usr/bin/env bash
# Builds upstream kube-proxy (default v1.37.1) from the k8s.io/kubernetes Go
# module and caches it, for the side-by-side tests and benchmarks (IPVS mode
# in the VM, iptables mode for `diff`, nftables mode for bench-scale).
#
#   hack/kube-proxy/build.sh            # build (or reuse) the cached binary
#   hack/kube-proxy/build.sh --print    # print the binary's path
#
# KNP_KUBE_PROXY_VERSION picks another version; KNP_CACHE and KNP_BUILD_NICE
# are as for hack/apiserver/build.sh, which does the work.
set -euo pipefail
export KNP_K8S_CMD=kube-proxy
export KNP_K8S_VERSION=${KNP_KUBE_PROXY_VERSION:-v1.37.1}
exec "$(dirname "$0")/../apiserver/build.sh" "$@"

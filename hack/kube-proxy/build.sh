#!/usr/bin/env bash
# Builds (or reuses) upstream kube-proxy (default v1.37.1) for the
# side-by-side tests and benchmarks (IPVS mode in the VM, iptables mode for
# `diff`, nftables mode for bench-scale): the Kubernetes part of
# hack/cluster/build.sh, sharing its helper module and Go build cache with
# kube-apiserver and the cluster's binaries.
#
#   hack/kube-proxy/build.sh            # build (or reuse) the cached binary
#   hack/kube-proxy/build.sh --print    # print the binary's path
#
# The binary is $KNP_CACHE/k8s-VERSION/bin/kube-proxy. KNP_KUBE_PROXY_VERSION
# picks another version; KNP_CACHE and KNP_BUILD_NICE are as for
# hack/cluster/build.sh.
set -euo pipefail
export KNP_K8S_VERSION=${KNP_KUBE_PROXY_VERSION:-${KNP_K8S_VERSION:-v1.37.1}}
cluster=$(dirname "$0")/../cluster/build.sh
if [[ ${1:-} == --print ]]; then
	exec "$cluster" --print kube-proxy
fi
exec "$cluster" kube-proxy

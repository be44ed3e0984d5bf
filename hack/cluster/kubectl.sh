#!/bin/sh
# kubectl against the cluster `make cluster` brought up: the API server
# listens on the node network (10.200.0.1:6443, network namespace
# "nodenet"), which the host's root namespace cannot reach, so kubectl runs
# inside that namespace.
set -e
cache=${KNP_CACHE:-/var/cache/kube-nftproxy}
dir=${KNP_CLUSTER_DIR:-/var/lib/knp-cluster}
kubectl=$cache/k8s-v1.37.1/bin/kubectl
[ -x "$kubectl" ] || kubectl=kubectl
exec nsenter --net=/run/netns/nodenet -- "$kubectl" --kubeconfig="$dir/admin.kubeconfig" "$@"

#!/bin/sh
# Runs the upstream e2e.test (hack/cluster/build.sh) against the cluster
# `make cluster` brought up, from inside the node network (namespace
# "nodenet"), where the API server, the nodes' addresses and NodePorts are
# reachable. Arguments go to e2e.test, e.g.:
#   hack/cluster/e2e.sh '--ginkgo.focus=\[sig-network\] Services.*\[Conformance\]' \
#       '--ginkgo.skip=\[Serial\]|\[Disruptive\]'
set -e
cache=${KNP_CACHE:-/var/cache/kube-nftproxy}
dir=${KNP_CLUSTER_DIR:-/var/lib/knp-cluster}
nodes=${KNP_CLUSTER_NODES:-2}
exec nsenter --net=/run/netns/nodenet -- "$cache/k8s-v1.37.1/bin/e2e.test" \
	--kubeconfig="$dir/admin.kubeconfig" --provider=skeleton --num-nodes=$nodes \
	--ginkgo.no-color "$@"

#!/usr/bin/env bash
# The cluster tier's builds as CI runs them (.ci/run): every binary
# (hack/cluster/build.sh), MetalLB while CI has the time for it, then the
# images (hack/cluster/images.sh).
#
#   hack/cluster/ci-builds.sh CI_START
#
# CI_START is the Unix time CI started. MetalLB, the load balancer of the
# tier's load balancer specs, takes about 17 minutes to build cold (its
# Kubernetes libraries are not the v1.37.1 build's) and nothing when
# cached; it is built only before minute 25 of CI. Without it the tier runs
# everything else and says which specs it left out.
set -euo pipefail
(($# == 1)) || {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}
cd "$(dirname "$0")/../.."
bash hack/cluster/build.sh
if (($(date +%s) - $1 < 25 * 60)); then
	KNP_CLUSTER_LB=metallb bash hack/cluster/build.sh metallb
else
	echo "ci: MetalLB not built (no time left for it cold): the cluster tier runs without its load balancer specs"
fi
bash hack/cluster/images.sh

#!/usr/bin/env bash
# Prints the version `make build` stamps into kube-nftproxy: git describe of
# the newest v* tag (v0.1.0, or v0.1.0-3-gabcdef012345 three commits after
# it), else v0.0.0-<commits>-g<hash> before the first tag, so that it is
# always a semantic version as kube-proxy's git_version is; -dirty when the
# checkout has uncommitted changes.
set -euo pipefail
cd "$(dirname "$0")/.."
if git describe --tags --match 'v[0-9]*' --abbrev=12 --dirty 2>/dev/null; then
	exit 0
fi
dirty=
git diff --quiet HEAD -- 2>/dev/null || dirty=-dirty
echo "v0.0.0-$(git rev-list --count HEAD)-g$(git rev-parse --short=12 HEAD)$dirty"

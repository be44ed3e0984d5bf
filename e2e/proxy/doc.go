// Package proxy holds the kernel end-to-end tests of kube-nftproxy: the real
// binary runs in the node namespace of an e2e/sandbox on a directory of
// Service/EndpointSlice/Node YAML, and e2e-agent servers in the pods answer
// real TCP and UDP through ClusterIPs and NodePorts. The tests also check
// what `nft list ruleset` prints, that `render` output is accepted by nft,
// `--cleanup`, edits of the state files, atomicity of big syncs under load
// and bad input.
//
// They need root and are skipped in -short mode:
//
//	sudo go test ./e2e/proxy/ -v
//
// $E2E_PROXY and $E2E_AGENT point them at prebuilt binaries; by default both
// are built into a temporary directory.
package proxy

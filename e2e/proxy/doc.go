// Package proxy holds the kernel end-to-end tests of kube-nftproxy: the real
// binary runs in the node namespace of an e2e/sandbox on a directory of
// Service/EndpointSlice/Node YAML, and e2e-agent servers in the pods answer
// real TCP and UDP through ClusterIPs and NodePorts. The tests also check
// what `nft list ruleset` prints, that `render` output is accepted by nft,
// `--cleanup`, edits of the state files, atomicity of big syncs under load
// and bad input.
//
// The fault-injection tests (faults_*_test.go, issue 9: never lose a node's
// rules, never run silently broken) each run under background traffic to a
// good Service (short TCP connections and UDP requests from pod-c through
// its ClusterIP) and log one line per fault for the README's table:
//
//	FAULT | <fault> | <recovery time> | <failed connections> | longest gap <d>
//
// Faults: the API server down across a proxy restart, kill -9 during a
// first sync of 5,000 Services, tampering with the tables by hand with
// nft, bad input in the state directory, 1,000 endpoint changes and a full
// sync of 10,000 Services under traffic, two instances in one network
// namespace, startup errors and SIGTERM.
//
// They need root and are skipped in -short mode:
//
//	sudo go test ./e2e/proxy/ -v
//
// $E2E_PROXY and $E2E_AGENT point them at prebuilt binaries; by default both
// are built into a temporary directory.
package proxy

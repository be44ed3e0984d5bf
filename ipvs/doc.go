// Package ipvs is the IPVS backend: a Plan of virtual servers, real
// servers, kube-ipvs0 addresses and helper set elements built from a
// model.State, and a Syncer that makes the kernel match a Plan in steps
// proportional to what changed, with graceful termination of removed TCP
// real servers. It talks to the kernel through package ipvsnl: IPVS
// through an ipvsnl.Kernel (the generic netlink Conn, or FakeKernel in
// tests), kube-ipvs0 through an AddrLink (ipvsnl.Dummy).
// The helper rules are one nft table per family, kube-nftproxy-ipvs
// (BuildHelperTable), with upstream's ipset names as nft sets and constant
// rules; NftHelper is the real Helper: those tables through package
// nftlib's transactions and kube-ipvs0's addresses through the AddrLink.
// Backend is the proxier.Backend of --proxy-mode ipvs: Planner, then
// Syncer, asking the loop for a sync when draining real servers are due a
// check; Sysctls and the connection timeouts (ipvsnl.Timeouts) are set
// once at start.
package ipvs

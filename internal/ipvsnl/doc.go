// Package ipvsnl holds the kernel clients of IPVS mode, apart from the mode
// so that package leftover can remove upstream kube-proxy's IPVS objects
// without importing a mode:
//
//   - Conn speaks the kernel's IPVS API (generic netlink family "IPVS"):
//     Read every virtual server with its real servers (one dump and one
//     read of /proc/net/ip_vs), Dests of one, Apply a list of Ops in
//     batched writes with an error per op, SetTimeouts (SET_CONFIG).
//     Kernel is what Conn does; FakeKernel does it in memory, answering
//     as the kernel does, for tests.
//   - Dummy is the link kube-ipvs0 over rtnetlink: created if missing, its
//     addresses listed, added and deleted in batches. DummyAddrs,
//     DeleteDummy and DeleteDummyAndServers work on it without creating it.
//
// Nothing here knows Kubernetes Services or plans: IPVS mode (package
// ipvs) decides what the kernel should hold. Package ipvsnltest helps
// tests that need the kernel's IPVS in a namespace of their own.
package ipvsnl

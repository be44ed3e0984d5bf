// Package ipvs is the IPVS backend: a Plan of virtual servers, real
// servers, kube-ipvs0 addresses and helper set elements built from a
// proxier.State; a batched generic netlink client for the kernel's IPVS
// API (Conn) and an in-memory one for tests (FakeKernel); and a Syncer
// that makes the kernel match a Plan in steps proportional to what
// changed, with graceful termination of removed TCP real servers.
// The helper table's rules, kube-ipvs0 itself and the wiring into the
// proxier come later.
package ipvs

package ipvs

import "net/netip"

// Kernel is the IPVS table of one network namespace. The real one is Conn;
// FakeKernel behaves like it for tests.
type Kernel interface {
	// Read returns every virtual server we could have made (TCP, UDP or
	// SCTP on an address: no firewall marks) with its real servers; the
	// Syncer reads once at start to adopt what is there.
	Read() ([]VirtualServer, error)
	// Dests returns one virtual server's real servers with their
	// connection counts.
	Dests(svc ServiceKey) ([]Dest, error)
	// Apply sends ops, in order, in as few writes as it can. The kernel
	// applies each on its own: errs[i] is ops[i]'s error, errs is nil
	// when all applied. err is a failure to talk to the kernel, after
	// which nobody knows what applied.
	Apply(ops []Op) (errs []error, err error)
}

// Helper holds what IPVS needs around it: kube-ipvs0's addresses (so the
// virtual addresses are local and reach IPVS in INPUT) and the elements of
// the helper table's sets (masquerade and filter rules read them).
type Helper interface {
	// Read returns the addresses on kube-ipvs0 and the sets' elements.
	Read() ([]netip.Addr, []Element, error)
	// Apply adds, then removes. After an error the Syncer reads again.
	Apply(c HelperChange) error
}

// HelperChange is one sync's change to the Helper.
type HelperChange struct {
	AddAddrs, DelAddrs []netip.Addr
	AddElems, DelElems []Element
}

func (c HelperChange) empty() bool {
	return len(c.AddAddrs)+len(c.DelAddrs)+len(c.AddElems)+len(c.DelElems) == 0
}

package ipvsnl

import (
	"errors"
	"fmt"
)

// Kernel is the IPVS table of one network namespace. The real one is Conn;
// FakeKernel behaves like it for tests.
type Kernel interface {
	// Read returns every virtual server we could have made (TCP, UDP or
	// SCTP on an address: no firewall marks) with its real servers; IPVS
	// mode's Syncer reads once at start to adopt what is there.
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

// DeleteMatching deletes, in one write, the virtual servers k reads that
// match, and returns how many it deleted; where ("on kube-ipvs0") is for
// the error.
func DeleteMatching(k Kernel, where string, match func(VirtualServer) bool) (int, error) {
	vss, err := k.Read()
	if err != nil {
		return 0, fmt.Errorf("reading IPVS services: %w", err)
	}
	var ops []Op
	for _, v := range vss {
		if match(v) {
			ops = append(ops, Op{Cmd: CmdDelService, Service: v.Service})
		}
	}
	if len(ops) == 0 {
		return 0, nil
	}
	opErrs, err := k.Apply(ops)
	if err != nil {
		if where != "" {
			return 0, fmt.Errorf("deleting IPVS services %s: %w", where, err)
		}
		return 0, fmt.Errorf("deleting IPVS services: %w", err)
	}
	// Apply's per-command errors: nil (or shorter) when all went.
	n := len(ops)
	var errs []error
	for i, e := range opErrs {
		if e != nil {
			n--
			errs = append(errs, fmt.Errorf("%s: %w", ops[i], e))
		}
	}
	return n, errors.Join(errs...)
}

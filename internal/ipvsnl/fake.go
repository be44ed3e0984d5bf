package ipvsnl

import (
	"maps"
	"net/netip"
	"slices"
	"syscall"
)

// FakeKernel is an in-memory IPVS table that answers as the kernel does
// (net/netfilter/ipvs/ip_vs_ctl.c, checked against Debian's 6.1 by
// TestKernelScript): EEXIST for a service or real server that exists,
// ESRCH for a command on (or Dests of) a missing service, ENOENT for a
// missing real server or an unknown scheduler, EINVAL for a scheduler name
// too long, a bad IPv6 prefix length or a real server of the other family
// without tunnelling, ERANGE for a weight over INT_MAX; each op of a batch
// succeeds or fails on its own. Tests set connection counts with SetConns.
type FakeKernel struct {
	services map[ServiceKey]*fakeService
	// Fail, when set, can fail an op with an error of its choice before
	// the fake looks at it.
	Fail func(Op) error
	// Journal, when set, records each applied op ("new-service tcp/...").
	Journal *[]string

	Writes, Ops, Reads, DestReads int // calls, for cost checks
}

type fakeService struct {
	svc   Service
	dests map[netip.AddrPort]Dest
}

var _ Kernel = (*FakeKernel)(nil)

// NewFakeKernel returns an empty IPVS table.
func NewFakeKernel() *FakeKernel { return &FakeKernel{services: map[ServiceKey]*fakeService{}} }

// schedNameMax is IP_VS_SCHEDNAME_MAXLEN: names of 16 bytes or more fail
// the netlink policy (EINVAL).
const schedNameMax = 16

// schedulers are the kernel's; "none" (no scheduler) is accepted too.
var schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// Read returns every service with its real servers, by key.
func (k *FakeKernel) Read() ([]VirtualServer, error) {
	k.Reads++
	return k.Snapshot(), nil
}

// Snapshot is Read without counting.
func (k *FakeKernel) Snapshot() []VirtualServer {
	out := make([]VirtualServer, 0, len(k.services))
	for _, s := range k.services {
		out = append(out, VirtualServer{Service: s.svc, Dests: s.sortedDests()})
	}
	slices.SortFunc(out, func(a, b VirtualServer) int { return a.ServiceKey.Compare(b.ServiceKey) })
	return out
}

func (s *fakeService) sortedDests() []Dest {
	ds := slices.Collect(maps.Values(s.dests))
	slices.SortFunc(ds, func(a, b Dest) int { return a.Addr.Compare(b.Addr) })
	return ds
}

// Dests returns one service's real servers; ESRCH when it does not exist.
func (k *FakeKernel) Dests(key ServiceKey) ([]Dest, error) {
	k.DestReads++
	s := k.services[key]
	if s == nil {
		return nil, syscall.ESRCH
	}
	return s.sortedDests(), nil
}

// SetConns sets a real server's connection counts.
func (k *FakeKernel) SetConns(key ServiceKey, dest netip.AddrPort, active, inactive uint32) {
	if s := k.services[key]; s != nil {
		if d, ok := s.dests[dest]; ok {
			d.Active, d.Inactive = active, inactive
			s.dests[dest] = d
		}
	}
}

// Apply applies each op on its own, as the kernel does within one write.
func (k *FakeKernel) Apply(ops []Op) ([]error, error) {
	k.Writes++
	var errs []error
	for i, op := range ops {
		k.Ops++
		err := k.apply(op)
		if err != nil {
			if errs == nil {
				errs = make([]error, len(ops))
			}
			errs[i] = err
		} else if k.Journal != nil {
			*k.Journal = append(*k.Journal, op.String())
		}
	}
	return errs, nil
}

func (k *FakeKernel) apply(op Op) error {
	if k.Fail != nil {
		if err := k.Fail(op); err != nil {
			return err
		}
	}
	// In the kernel's order (ip_vs_genl_set_cmd): attribute policy, the
	// service lookup, the real server's family, then the command itself.
	full := op.Cmd == CmdNewService || op.Cmd == CmdSetService
	if full && len(op.Service.Scheduler) >= schedNameMax {
		return syscall.EINVAL
	}
	s := k.services[op.Service.ServiceKey]
	if op.Cmd != CmdNewService && s == nil {
		return syscall.ESRCH
	}
	isDest := op.Cmd == CmdNewDest || op.Cmd == CmdSetDest || op.Cmd == CmdDelDest
	if isDest && op.Cmd != CmdDelDest && op.Dest.Addr.Addr().Is4() != op.Service.Addr.Is4() && op.Dest.Fwd&FwdMask != FwdTunnel {
		return syscall.EINVAL // mixed families only with tunnelling
	}
	if full {
		if op.Cmd == CmdNewService && s != nil {
			return syscall.EEXIST
		}
		if op.Service.Scheduler != "none" && !slices.Contains(schedulers, op.Service.Scheduler) {
			return syscall.ENOENT
		}
		if op.Service.Addr.Is6() && (op.Service.Netmask < 1 || op.Service.Netmask > 128) {
			return syscall.EINVAL
		}
		if s == nil {
			s = &fakeService{dests: map[netip.AddrPort]Dest{}}
			k.services[op.Service.ServiceKey] = s
		}
		s.svc = op.Service
		return nil
	}
	if (op.Cmd == CmdNewDest || op.Cmd == CmdSetDest) && op.Dest.Weight > maxWeight {
		return syscall.ERANGE // the kernel's weight is an int: "less than zero"
	}
	d, exists := s.dests[op.Dest.Addr]
	switch op.Cmd {
	case CmdDelService:
		delete(k.services, op.Service.ServiceKey)
	case CmdNewDest:
		if exists {
			return syscall.EEXIST
		}
		s.dests[op.Dest.Addr] = Dest{Addr: op.Dest.Addr, Weight: op.Dest.Weight, Fwd: op.Dest.Fwd & FwdMask}
	case CmdSetDest:
		if !exists {
			return syscall.ENOENT
		}
		d.Weight, d.Fwd = op.Dest.Weight, op.Dest.Fwd&FwdMask
		s.dests[op.Dest.Addr] = d
	case CmdDelDest:
		if !exists {
			return syscall.ENOENT
		}
		delete(s.dests, op.Dest.Addr)
	default:
		return syscall.EINVAL
	}
	return nil
}

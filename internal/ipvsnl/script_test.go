package ipvsnl_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// The same script runs against FakeKernel here and against the kernel in
// the VM (TestKernelScript): each batch's per-command errors and the table
// read back afterwards must be the ones written below, so the fake answers
// what the kernel answers.

type scriptStep struct {
	name string
	ops  []ipvsnl.Op
	errs map[int]error // by index in ops; the others succeed
	// dests: a Dests call after the batch, and what it must say.
	dests    *ipvsnl.ServiceKey
	destsErr error
	nDests   int
}

func scriptSteps() (steps []scriptStep, final []ipvsnl.VirtualServer) {
	a := svc("10.96.0.1", model.TCP, 80, "rr")
	b := svc("10.96.0.2", model.UDP, 53, "wrr")
	missing := svc("10.96.0.3", model.TCP, 80, "rr")
	a6 := svc("fd00::1", model.SCTP, 9000, "sh")
	badSched := svc("10.96.0.4", model.TCP, 80, "nosuch")
	longSched := svc("10.96.0.7", model.TCP, 80, "no-such-scheduler") // over IP_VS_SCHEDNAME_MAXLEN
	emptySched := svc("10.96.0.5", model.TCP, 80, "")
	none := svc("10.96.0.6", model.TCP, 80, "none")
	mask0, mask129 := a6, a6
	mask0.Port, mask0.Netmask = 9001, 0
	mask129.Port, mask129.Netmask = 9002, 129
	aBadSched := a
	aBadSched.Scheduler = "nosuch"
	aPersistent := a
	aPersistent.Flags, aPersistent.Timeout = ipvsnl.FlagPersistent, 300
	rs1, rs2, rs3 := dest("10.244.0.1:8080", 1), dest("10.244.0.2:8080", 2), dest("10.244.0.3:8080", 3)
	rs6 := dest("[fd00:10:244::1]:9000", 1)
	heavy := dest("10.244.0.9:8080", 1<<31) // more than the kernel's int holds
	newSvc := func(s ipvsnl.Service) ipvsnl.Op { return ipvsnl.Op{Cmd: ipvsnl.CmdNewService, Service: s} }
	op := func(c ipvsnl.Cmd, s ipvsnl.Service, d ipvsnl.Dest) ipvsnl.Op {
		return ipvsnl.Op{Cmd: c, Service: s, Dest: d}
	}

	steps = []scriptStep{{
		name: "one bad command of each kind in a batch; the rest applies",
		ops: []ipvsnl.Op{
			newSvc(a),                                       // 0
			op(ipvsnl.CmdNewDest, a, rs1),                   // 1
			newSvc(a),                                       // 2 duplicate service
			op(ipvsnl.CmdNewDest, a, rs2),                   // 3
			op(ipvsnl.CmdNewDest, a, rs1),                   // 4 duplicate real server
			op(ipvsnl.CmdDelDest, a, rs3),                   // 5 missing real server
			op(ipvsnl.CmdSetDest, a, rs3),                   // 6 missing real server
			op(ipvsnl.CmdNewDest, missing, rs1),             // 7 missing service
			op(ipvsnl.CmdDelDest, missing, rs1),             // 8
			{Cmd: ipvsnl.CmdSetService, Service: missing},   // 9
			{Cmd: ipvsnl.CmdDelService, Service: missing},   // 10
			newSvc(badSched),                                // 11 unknown scheduler
			newSvc(emptySched),                              // 12 no scheduler
			{Cmd: ipvsnl.CmdSetService, Service: aBadSched}, // 13 unknown scheduler, existing service
			newSvc(a6),                      // 14
			newSvc(mask0),                   // 15 IPv6 prefix length 0
			newSvc(mask129),                 // 16 IPv6 prefix length 129
			op(ipvsnl.CmdNewDest, a6, rs6),  // 17
			op(ipvsnl.CmdNewDest, a, rs6),   // 18 IPv6 real server behind IPv4 with masq
			op(ipvsnl.CmdNewDest, a, heavy), // 19 weight over INT_MAX
			op(ipvsnl.CmdSetDest, a, ipvsnl.Dest{Addr: rs2.Addr, Weight: 1 << 31}), // 20 same
			newSvc(b),    // 21
			newSvc(none), // 22 the kernel's "no scheduler"
			{Cmd: ipvsnl.CmdSetService, Service: aPersistent}, // 23
			newSvc(longSched), // 24 scheduler name too long for the kernel's policy
		},
		errs: map[int]error{
			2: syscall.EEXIST, 4: syscall.EEXIST, 5: syscall.ENOENT, 6: syscall.ENOENT,
			7: syscall.ESRCH, 8: syscall.ESRCH, 9: syscall.ESRCH, 10: syscall.ESRCH,
			11: syscall.ENOENT, 12: syscall.ENOENT, 13: syscall.ENOENT,
			15: syscall.EINVAL, 16: syscall.EINVAL, 18: syscall.EINVAL,
			19: syscall.ERANGE, 20: syscall.ERANGE, 24: syscall.EINVAL,
		},
	}, {
		name:  "a service without real servers",
		dests: &b.ServiceKey,
	}, {
		name:     "a missing service's real servers",
		dests:    &missing.ServiceKey,
		destsErr: syscall.ESRCH,
	}, {
		name:   "a service's real servers",
		dests:  &a.ServiceKey,
		nDests: 2,
	}, {
		name: "deleted and made again: no real servers left",
		ops: []ipvsnl.Op{
			{Cmd: ipvsnl.CmdDelService, Service: b},
			op(ipvsnl.CmdNewDest, b, rs1), // 1: gone
			newSvc(b),
			{Cmd: ipvsnl.CmdDelService, Service: none},
			{Cmd: ipvsnl.CmdDelService, Service: none}, // 4
			op(ipvsnl.CmdDelDest, a, rs1),
			op(ipvsnl.CmdSetDest, a, ipvsnl.Dest{Addr: rs2.Addr, Weight: 0}),
		},
		errs: map[int]error{1: syscall.ESRCH, 4: syscall.ESRCH},
	}}

	// A batch larger than one write (batchBytes): errors land on the right
	// commands across writes.
	big := scriptStep{name: "errors across writes", errs: map[int]error{}}
	for i := range 1500 {
		s := svc(fmt.Sprintf("10.97.%d.%d", i/250, i%250+1), model.TCP, 80, "rr")
		big.ops = append(big.ops, newSvc(s), op(ipvsnl.CmdNewDest, s, rs1))
		if i%300 == 7 {
			big.errs[len(big.ops)] = syscall.EEXIST
			big.ops = append(big.ops, op(ipvsnl.CmdNewDest, s, rs1))
		}
		if i%300 == 150 {
			big.errs[len(big.ops)] = syscall.ESRCH
			big.ops = append(big.ops, op(ipvsnl.CmdNewDest, missing, rs1))
		}
		if i >= 10 {
			big.ops = append(big.ops, ipvsnl.Op{Cmd: ipvsnl.CmdDelService, Service: s})
		}
	}
	steps = append(steps, big)

	final = []ipvsnl.VirtualServer{
		{Service: aPersistent, Dests: []ipvsnl.Dest{{Addr: rs2.Addr, Weight: 0}}},
		{Service: b},
		{Service: a6, Dests: []ipvsnl.Dest{rs6}},
	}
	for i := range 10 {
		s := svc(fmt.Sprintf("10.97.0.%d", i+1), model.TCP, 80, "rr")
		final = append(final, ipvsnl.VirtualServer{Service: s, Dests: []ipvsnl.Dest{rs1}})
	}
	return steps, final
}

// runScript runs the script against k.
func runScript(t *testing.T, k ipvsnl.Kernel) {
	steps, final := scriptSteps()
	for _, st := range steps {
		if len(st.ops) > 0 {
			errs, err := k.Apply(st.ops)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			for i, op := range st.ops {
				var got error
				if errs != nil {
					got = errs[i]
				}
				if want := st.errs[i]; !sameErrno(got, want) {
					t.Errorf("%s: command %d (%s): error %v, want %v", st.name, i, op, got, want)
				}
			}
		}
		if st.dests != nil {
			ds, err := k.Dests(*st.dests)
			if !sameErrno(err, st.destsErr) || len(ds) != st.nDests {
				t.Errorf("%s: Dests(%s) = %d real servers, %v; want %d, %v", st.name, *st.dests, len(ds), err, st.nDests, st.destsErr)
			}
		}
	}
	got, err := k.Read()
	if err != nil {
		t.Fatal(err)
	}
	ipvsnltest.SameTables(t, "after the script", got, final)
}

func sameErrno(got, want error) bool {
	if want == nil || got == nil {
		return got == nil && want == nil
	}
	return errors.Is(got, want)
}

func TestFakeScript(t *testing.T) { runScript(t, ipvsnl.NewFakeKernel()) }

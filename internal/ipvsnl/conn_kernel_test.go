package ipvsnl_test

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl/ipvsnltest"
	"github.com/kube-nftproxy/kube-nftproxy/internal/netns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Kernel tests: they need IPVS (run them with hack/vm/run.sh ./internal/ipvsnl) and
// each makes its own network namespace, IPVS state being per netns.

func svc(addr string, p model.Protocol, port uint16, sched string) ipvsnl.Service {
	a := netip.MustParseAddr(addr)
	s := ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: a, Protocol: p, Port: port}, Scheduler: sched, Netmask: 0xffffffff}
	if a.Is6() {
		s.Netmask = 128
	}
	return s
}

func dest(ap string, w uint32) ipvsnl.Dest {
	return ipvsnl.Dest{Addr: netip.MustParseAddrPort(ap), Weight: w, Fwd: ipvsnl.FwdMasq}
}

// keysOnly drops the settings /proc/net/ip_vs does not give in our terms.
func keysOnly(vss []ipvsnl.VirtualServer) []ipvsnl.VirtualServer {
	out := make([]ipvsnl.VirtualServer, len(vss))
	for i, v := range vss {
		out[i] = ipvsnl.VirtualServer{Service: ipvsnl.Service{ServiceKey: v.ServiceKey}, Dests: v.Dests}
	}
	return out
}

var allSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"}

// roundTripTable: both families, the three protocols, every scheduler
// upstream accepts (mh with its flag), persistence with a timeout and a
// netmask other than the one-client default, weights from 0 to the largest.
func roundTripTable() []ipvsnl.VirtualServer {
	var vss []ipvsnl.VirtualServer
	for i, sched := range allSchedulers {
		for _, fam := range []struct{ vip, rs string }{{"10.96.0.%d", "10.244.%d.%d"}, {"fd00::%x", "fd00:10:244:%x::%x"}} {
			for j, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
				s := svc(fmt.Sprintf(fam.vip, 10+i), p, uint16(80+j), sched)
				if sched == "mh" {
					s.Flags |= ipvsnl.FlagSched2
				}
				if i%3 == 1 {
					s.Flags |= ipvsnl.FlagPersistent
					s.Timeout = uint32(10800 + i)
					if s.Addr.Is4() {
						s.Netmask = 0xffffff00
					} else {
						s.Netmask = 64
					}
				}
				v := ipvsnl.VirtualServer{Service: s}
				for k := range 3 {
					rs := fmt.Sprintf(fam.rs, i, k+2)
					if s.Addr.Is6() {
						rs = "[" + rs + "]"
					}
					w := uint32(k + 1)
					switch {
					case k == 2 && i == 0:
						w = ipvsnl.MaxWeight
					case k == 2 && i == 1:
						w = 0
					}
					v.Dests = append(v.Dests, dest(fmt.Sprintf("%s:%d", rs, 8080+j), w))
				}
				vss = append(vss, v)
			}
		}
	}
	return vss
}

func TestKernelRoundTrip(t *testing.T) {
	c, ns := ipvsnltest.DialNew(t)
	want := roundTripTable()
	fake := ipvsnl.NewFakeKernel()
	apply := func(what string, ops []ipvsnl.Op) {
		t.Helper()
		for name, k := range map[string]ipvsnl.Kernel{"kernel": c, "fake": fake} {
			errs, err := k.Apply(ops)
			if err != nil {
				t.Fatalf("%s: %s: %v", what, name, err)
			}
			for i, e := range errs {
				if e != nil {
					t.Errorf("%s: %s: %s: %v", what, name, ops[i], e)
				}
			}
		}
	}
	check := func(what string) {
		t.Helper()
		got, err := c.Read()
		if err != nil {
			t.Fatal(err)
		}
		ipvsnltest.SameTables(t, what+": Read", got, want)
		ipvsnltest.SameTables(t, what+": FakeKernel.Read", fake.Snapshot(), want)
		for _, v := range want {
			ds, err := c.Dests(v.ServiceKey)
			if err != nil {
				t.Fatalf("Dests(%s): %v", v.ServiceKey, err)
			}
			ipvsnltest.SameTables(t, what+": Dests", []ipvsnl.VirtualServer{{Service: v.Service, Dests: ds}}, []ipvsnl.VirtualServer{v})
		}
		// /proc/net/ip_vs agrees with the netlink dumps.
		var proc map[ipvsnl.ServiceKey][]ipvsnl.Dest
		if err := netns.Do(ns, func() error {
			f, err := os.Open("/proc/thread-self/net/ip_vs")
			if err != nil {
				return err
			}
			defer f.Close()
			proc, err = ipvsnl.ParseProcIPVS(f)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		var fromProc []ipvsnl.VirtualServer
		for k, ds := range proc {
			fromProc = append(fromProc, ipvsnl.VirtualServer{Service: ipvsnl.Service{ServiceKey: k}, Dests: ds})
		}
		ipvsnltest.SameTables(t, what+": /proc/net/ip_vs", fromProc, keysOnly(want))
	}

	apply("create", ipvsnltest.CreateOps(want))
	check("created")

	// Change settings of every fourth service, weights of some real
	// servers, delete some real servers and some services.
	var ops []ipvsnl.Op
	for i := range want {
		v := &want[i]
		switch i % 4 {
		case 0:
			v.Flags ^= ipvsnl.FlagPersistent
			if v.Flags&ipvsnl.FlagPersistent != 0 {
				v.Timeout = 60
			} else {
				v.Timeout = 0
			}
			if v.Scheduler != "mh" {
				v.Scheduler = "wrr"
			}
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdSetService, Service: v.Service})
		case 1:
			v.Dests[0].Weight = 7
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdSetDest, Service: v.Service, Dest: v.Dests[0]})
		case 2:
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdDelDest, Service: v.Service, Dest: v.Dests[1]})
			v.Dests = slices.Delete(v.Dests, 1, 2)
		}
	}
	var kept []ipvsnl.VirtualServer
	for i, v := range want {
		if i%4 == 3 {
			ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdDelService, Service: v.Service})
			continue
		}
		kept = append(kept, v)
	}
	want = kept
	apply("update", ops)
	check("updated")
}

// TestKernelScript runs TestFakeScript's script against the kernel.
func TestKernelScript(t *testing.T) {
	c, _ := ipvsnltest.DialNew(t)
	runScript(t, c)
}

// Another namespace's services share the kernel's service hash table.
// Debian's 6.1 /proc/net/ip_vs then loses services at read() boundaries
// (seq_next counts every namespace's services into the position, seq_start
// only this one's): Read must still return every real server.
func TestKernelReadBesideOtherNamespace(t *testing.T) {
	other, _ := ipvsnltest.DialNew(t)
	c, _ := ipvsnltest.DialNew(t)
	var mine, theirs []ipvsnl.VirtualServer
	for i := range 400 {
		s := svc(fmt.Sprintf("10.98.%d.%d", i/200, i%200+1), model.TCP, 80, "rr")
		theirs = append(theirs, ipvsnl.VirtualServer{Service: s, Dests: []ipvsnl.Dest{dest("10.244.9.9:80", 1)}})
		s.Port = 81
		mine = append(mine, ipvsnl.VirtualServer{Service: s, Dests: []ipvsnl.Dest{dest("10.244.0.1:80", 1), dest("10.244.0.2:80", 2)}})
	}
	ipvsnltest.MustApply(t, other, ipvsnltest.CreateOps(theirs))
	ipvsnltest.MustApply(t, c, ipvsnltest.CreateOps(mine))
	got, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	ipvsnltest.SameTables(t, "Read beside another namespace", got, mine)
}

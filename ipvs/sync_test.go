package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

type rig struct {
	t       *testing.T
	k       *ipvsnl.FakeKernel
	h       *FakeHelper
	clk     *clock
	s       *Syncer
	journal []string
}

func newRig(t *testing.T) *rig {
	r := &rig{t: t, k: ipvsnl.NewFakeKernel(), h: NewFakeHelper(), clk: &clock{time.Unix(1e9, 0)}}
	r.k.Journal, r.h.Journal = &r.journal, &r.journal
	r.restart()
	return r
}

// restart is a new process over the same kernel.
func (r *rig) restart() {
	r.s = NewSyncer(r.k, r.h, SyncConfig{DrainTimeout: 15 * time.Minute, DrainCheck: time.Minute, Now: r.clk.now,
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.255.0/24")}})
}

func (r *rig) sync(st *model.State) SyncResult {
	r.t.Helper()
	r.journal = nil
	res, err := r.s.Sync(BuildPlan(st, Config{}, nodeAddrs))
	if err != nil {
		r.t.Fatalf("sync: %v", err)
	}
	return res
}

// kernelMatches checks the fake kernel and helper against the plan.
func (r *rig) kernelMatches(st *model.State, draining ...string) {
	r.t.Helper()
	p := BuildPlan(st, Config{}, nodeAddrs)
	var want, got strings.Builder
	_ = WriteRules(&want, p.VirtualServers())
	for _, v := range r.k.Snapshot() {
		v.Dests = slices.DeleteFunc(v.Dests, func(d ipvsnl.Dest) bool {
			return slices.Contains(draining, v.ServiceKey.String()+" "+d.Addr.String()) && d.Weight == 0
		})
		_ = WriteRules(&got, []ipvsnl.VirtualServer{v})
	}
	if got.String() != want.String() {
		r.t.Errorf("kernel:\n%s\nplan:\n%s", &got, &want)
	}
	addrs, elems, _ := r.h.Read()
	slices.SortFunc(addrs, netip.Addr.Compare)
	slices.SortFunc(elems, compareElements)
	if !slices.Equal(addrs, p.Addrs()) || !slices.Equal(elems, p.Elements()) {
		r.t.Errorf("helper holds %v and %d elements, plan %v and %d", addrs, len(elems), p.Addrs(), len(p.Elements()))
	}
}

func clone(st *model.State) *model.State {
	out := model.NewState()
	out.Node = st.Node
	for n, s := range st.Services.All() {
		out.Services, out.Endpoints = out.Services.With(n, s), out.Endpoints.With(n, st.Endpoints.Get(n))
	}
	return out
}

var (
	dnsTCP = spn("kube-system", "kube-dns", "dns-tcp")
	dnsUDP = spn("kube-system", "kube-dns", "dns")
	dnsVIP = ipvsnl.ServiceKey{Addr: ip("10.96.0.10"), Protocol: model.TCP, Port: 53}
	remote = netip.MustParseAddrPort("10.244.1.5:53")
)

func TestSyncFromEmptyThenNothing(t *testing.T) {
	r := newRig(t)
	st := demoState()
	res := r.sync(st)
	r.kernelMatches(st)
	if res.Writes != 1 {
		t.Errorf("%d writes for the first sync, want 1 batch", res.Writes)
	}
	// Virtual servers before the addresses that lead to them.
	firstAddr := slices.IndexFunc(r.journal, func(s string) bool { return strings.HasPrefix(s, "add-addr") })
	lastIPVS := slices.IndexFunc(r.journal, func(s string) bool { return strings.HasPrefix(s, "new-") })
	for i, s := range r.journal {
		if strings.HasPrefix(s, "new-") {
			lastIPVS = i
		}
	}
	if firstAddr < lastIPVS {
		t.Errorf("an address was added before the virtual servers:\n%s", strings.Join(r.journal, "\n"))
	}
	if res := r.sync(st); res.Ops != 0 || res.Writes != 0 || !res.Helper.empty() || res.DestReads != 0 {
		t.Errorf("an unchanged plan cost %+v", res)
	}
}

// A sync costs what changed: one endpoint gone among many services is one
// command, whatever the number of virtual servers.
func TestSyncCostsWhatChanged(t *testing.T) {
	r := newRig(t)
	st := demoState()
	for i := range 300 {
		n := spn("bulk", fmt.Sprintf("s%d", i), "")
		st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.UDP, Port: 80,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})}})
		st.Endpoints = st.Endpoints.With(n, []model.Endpoint{ready("10.244.2.1", 80, "b"), ready("10.244.2.2", 80, "b")})
	}
	pl := NewPlanner(Config{})
	if _, err := r.s.Sync(pl.Plan(st, nodeAddrs)); err != nil {
		t.Fatal(err)
	}
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsUDP, st.Endpoints.Get(dnsUDP)[:1])
	r.k.Ops, r.k.Writes, r.k.DestReads = 0, 0, 0
	res, err := r.s.Sync(pl.Plan(next, nodeAddrs))
	if err != nil {
		t.Fatal(err)
	}
	if r.k.Ops != 1 || r.k.Writes != 1 || r.k.DestReads != 0 || !res.Helper.empty() {
		t.Errorf("one UDP endpoint removed cost %d ops in %d writes, %d dest reads, helper %+v", r.k.Ops, r.k.Writes, r.k.DestReads, res.Helper)
	}
	r.kernelMatches(next)
}

func TestSyncRemovalOrder(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	next := clone(st)
	next.Services = next.Services.Without(dnsTCP)
	next.Services = next.Services.Without(dnsUDP)
	r.sync(next)
	r.kernelMatches(next)
	delAddr := slices.Index(r.journal, "del-addr 10.96.0.10")
	delSvc := slices.IndexFunc(r.journal, func(s string) bool { return strings.HasPrefix(s, "del-service tcp/10.96.0.10:53") })
	if delAddr < 0 || delSvc < 0 || delAddr > delSvc {
		t.Errorf("the address must go before its virtual servers:\n%s", strings.Join(r.journal, "\n"))
	}
	// The ClusterIP stays while one of its ports remains.
	next2 := clone(st)
	next2.Services = next2.Services.Without(dnsTCP)
	r2 := newRig(t)
	r2.sync(st)
	r2.sync(next2)
	if !r2.h.Addrs[ip("10.96.0.10")] {
		t.Error("an address shared by two ports left with one of them")
	}
}

func TestSyncGracefulTermination(t *testing.T) {
	for _, tt := range []struct {
		name  string
		conns uint32
		steps []time.Duration // clock advances, a sync after each
		gone  int             // after how many steps the server is deleted (0: at once)
	}{
		{"no connections: deleted at once", 0, nil, 0},
		{"connections end: deleted at the next check", 3, []time.Duration{30 * time.Second, 31 * time.Second}, 2},
		{"connections stay: deleted at the bound", 3, []time.Duration{10 * time.Minute, 5 * time.Minute}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			st := demoState()
			r.sync(st)
			r.k.SetConns(dnsVIP, remote, tt.conns, 0)
			next := clone(st)
			next.Endpoints = next.Endpoints.With(dnsTCP, st.Endpoints.Get(dnsTCP)[:1])
			r.sync(next)
			present := func() (ipvsnl.Dest, bool) {
				ds, _ := r.k.Dests(dnsVIP)
				i := slices.IndexFunc(ds, func(d ipvsnl.Dest) bool { return d.Addr == remote })
				if i < 0 {
					return ipvsnl.Dest{}, false
				}
				return ds[i], true
			}
			for step := 0; ; step++ {
				d, ok := present()
				if step == tt.gone {
					if ok {
						t.Fatalf("after %d steps the server is still there: %+v", step, d)
					}
					break
				}
				if !ok || d.Weight != 0 {
					t.Fatalf("after %d steps: present %v weight %d, want draining with weight 0", step, ok, d.Weight)
				}
				r.clk.advance(tt.steps[step])
				if step == 0 && tt.name == "connections end: deleted at the next check" {
					r.k.SetConns(dnsVIP, remote, 0, 0)
					if res := r.sync(next); res.DestReads != 0 {
						t.Errorf("counts read %d times before the check is due", res.DestReads)
					}
					continue
				}
				r.sync(next)
			}
			r.kernelMatches(next)
			if !r.s.NextDrainCheck().IsZero() {
				t.Error("a drain check is still scheduled")
			}
		})
	}
}

func TestSyncUDPRemovedAtOnce(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	udpVIP := ipvsnl.ServiceKey{Addr: ip("10.96.0.10"), Protocol: model.UDP, Port: 53}
	r.k.SetConns(udpVIP, remote, 0, 5)
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsUDP, st.Endpoints.Get(dnsUDP)[:1])
	res := r.sync(next)
	if res.Draining != 0 || !slices.Contains(r.journal, "del-dest udp/10.96.0.10:53 -> 10.244.1.5:53") {
		t.Errorf("UDP server not deleted at once: %+v\n%s", res, strings.Join(r.journal, "\n"))
	}
	r.kernelMatches(next)
}

func TestSyncEndpointBackFromDraining(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	r.k.SetConns(dnsVIP, remote, 2, 0)
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsTCP, st.Endpoints.Get(dnsTCP)[:1])
	if res := r.sync(next); res.Draining != 1 {
		t.Fatalf("%d draining, want 1", res.Draining)
	}
	res := r.sync(st)
	if want := []string{"set-dest tcp/10.96.0.10:53 -> 10.244.1.5:53 w1"}; !slices.Equal(r.journal, want) || res.Draining != 0 {
		t.Errorf("journal %q (draining %d), want %q: weight back, connections kept", r.journal, res.Draining, want)
	}
	if ds, _ := r.k.Dests(dnsVIP); ds[1].Active != 2 {
		t.Errorf("the server was re-created: %+v", ds[1])
	}
	r.kernelMatches(st)
}

func TestSyncRestartAdopts(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	r.k.SetConns(dnsVIP, remote, 1, 0)
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsTCP, st.Endpoints.Get(dnsTCP)[:1])
	r.sync(next) // draining
	// Someone else's virtual servers: one inside --ipvs-exclude-cidrs.
	stray := ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: ip("10.96.99.99"), Protocol: model.TCP, Port: 1}, Scheduler: "rr", Netmask: 0xffffffff}
	kept := ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: ip("192.168.255.1"), Protocol: model.TCP, Port: 1}, Scheduler: "rr", Netmask: 0xffffffff}
	_, _ = r.k.Apply([]ipvsnl.Op{{Cmd: ipvsnl.CmdNewService, Service: stray}, {Cmd: ipvsnl.CmdNewService, Service: kept}})

	r.restart()
	r.k.Ops = 0
	res := r.sync(next)
	if want := []string{"del-service tcp/10.96.99.99:1"}; !slices.Equal(r.journal, want) {
		t.Errorf("restart changed %q, want only %q (adopt, never flush)", r.journal, want)
	}
	if res.Draining != 1 {
		t.Errorf("%d draining after the restart, want the weight-0 leftover", res.Draining)
	}
	if _, err := r.k.Dests(kept.ServiceKey); err != nil {
		t.Error("a virtual server inside --ipvs-exclude-cidrs was removed")
	}
	r.k.SetConns(dnsVIP, remote, 0, 0)
	r.clk.advance(time.Minute)
	r.sync(next)
	if ds, _ := r.k.Dests(dnsVIP); len(ds) != 1 {
		t.Errorf("the reconstructed drain did not finish: %+v", ds)
	}
}

func TestSyncPerOpErrors(t *testing.T) {
	r := newRig(t)
	st := demoState()
	bad := netip.MustParseAddrPort("10.244.1.5:53")
	r.k.Fail = func(op ipvsnl.Op) error {
		if op.Cmd == ipvsnl.CmdNewDest && op.Dest.Addr == bad && op.Service.Protocol == model.UDP {
			return syscall.ENOMEM
		}
		if op.Cmd == ipvsnl.CmdNewService && op.Service.Addr == ip("198.51.100.10") {
			return syscall.EINVAL
		}
		return nil
	}
	_, err := r.s.Sync(BuildPlan(st, Config{}, nodeAddrs))
	if !errors.Is(err, syscall.ENOMEM) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("error %v, want both failures", err)
	}
	if r.h.Addrs[ip("198.51.100.10")] {
		t.Error("an address was bound though its virtual server failed")
	}
	if _, err := r.k.Dests(ipvsnl.ServiceKey{Addr: ip("10.96.0.1"), Protocol: model.TCP, Port: 443}); err != nil {
		t.Error("the rest of the batch did not apply")
	}
	r.k.Fail = nil
	r.k.Ops = 0
	res := r.sync(st)
	if res.Ops != 3 { // the dest, the service and its one dest
		t.Errorf("retry sent %d ops, want 3: %q", res.Ops, r.journal)
	}
	r.kernelMatches(st)
}

func TestSyncSchedulerChange(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	r.journal = nil
	if _, err := r.s.Sync(BuildPlan(st, Config{Scheduler: "wlc"}, nodeAddrs)); err != nil {
		t.Fatal(err)
	}
	for _, j := range r.journal {
		if !strings.HasPrefix(j, "set-service") {
			t.Errorf("a scheduler change sent %q", j)
		}
	}
	for _, v := range r.k.Snapshot() {
		if v.Scheduler != "wlc" {
			t.Errorf("%s still uses %s", v.ServiceKey, v.Scheduler)
		}
	}
}

// When the addresses cannot be removed, their virtual servers stay: a
// local address without its virtual server would be answered by the host.
func TestSyncHelperFailureKeepsServers(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	next := clone(st)
	next.Services = next.Services.Without(dnsTCP)
	next.Services = next.Services.Without(dnsUDP)
	r.h.Fail = func(HelperChange) error { return syscall.EBUSY }
	if _, err := r.s.Sync(BuildPlan(next, Config{}, nodeAddrs)); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("error %v, want the helper's", err)
	}
	if _, err := r.k.Dests(dnsVIP); err != nil {
		t.Error("a virtual server was deleted while its address could not be removed")
	}
	r.h.Fail = nil
	r.sync(next)
	r.kernelMatches(next)
}

// The bound runs from the removal, not from the last change to the service.
func TestSyncDrainBoundSurvivesOtherChanges(t *testing.T) {
	r := newRig(t)
	st := demoState()
	r.sync(st)
	r.k.SetConns(dnsVIP, remote, 1, 0)
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsTCP, st.Endpoints.Get(dnsTCP)[:1])
	r.sync(next)
	r.clk.advance(10 * time.Minute)
	again := clone(next)
	again.Endpoints = again.Endpoints.With(dnsTCP, append(slices.Clone(next.Endpoints.Get(dnsTCP)), ready("10.244.3.3", 53, "c")))
	r.sync(again)
	r.clk.advance(5 * time.Minute)
	r.sync(again)
	r.kernelMatches(again)
}

package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

type backendRig struct {
	k       *ipvsnl.FakeKernel
	h       *FakeHelper
	b       *Backend
	clk     *clock
	helpers int // NewHelper calls
	asked   []time.Time
	cleaned int
}

func newBackendRig(t *testing.T) *backendRig {
	r := &backendRig{k: ipvsnl.NewFakeKernel(), h: NewFakeHelper(), clk: &clock{time.Unix(1e9, 0)}}
	r.b = NewBackend(r.k, BackendConfig{
		Sync:      SyncConfig{Now: r.clk.now, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("192.168.255.0/24")}},
		NodeAddrs: func() ([]netip.Addr, error) { return nodeAddrs, nil },
		NewHelper: func(model.Node) (Helper, error) { r.helpers++; return r.h, nil },
		CleanupHelper: func() (bool, error) {
			r.cleaned++
			n := len(r.h.Addrs) + len(r.h.Elems)
			r.h.Addrs, r.h.Elems = map[netip.Addr]bool{}, map[Element]bool{}
			return n > 0, nil
		},
		SyncAt: func(t time.Time) { r.asked = append(r.asked, t) },
	})
	return r
}

func (r *backendRig) sync(t *testing.T, st *model.State) proxier.SyncResult {
	t.Helper()
	res, err := r.b.Sync(context.Background(), st)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

// The backend programs the plan of a State into the kernel and helper; an
// unchanged State costs nothing, one new endpoint one command.
func TestBackendSync(t *testing.T) {
	r := newBackendRig(t)
	st := demoState()
	res := r.sync(t, st)
	if !res.Full || !res.Changed || res.Messages == 0 {
		t.Errorf("first sync: %+v, want a full, changed one", res)
	}
	want := BuildPlan(st, Config{}, nodeAddrs)
	if got, w := len(r.k.Snapshot()), len(want.VirtualServers()); got != w {
		t.Errorf("kernel holds %d virtual servers, plan %d", got, w)
	}
	if len(r.h.Addrs) != len(want.Addrs()) || len(r.h.Elems) != len(want.Elements()) {
		t.Errorf("helper holds %d addresses and %d elements, plan %d and %d", len(r.h.Addrs), len(r.h.Elems), len(want.Addrs()), len(want.Elements()))
	}

	ops, applies := r.k.Ops, r.h.Applies
	if res := r.sync(t, st); res.Changed || res.Full || r.k.Ops != ops || r.h.Applies != applies {
		t.Errorf("unchanged state: %+v, %d ops, %d helper applies", res, r.k.Ops-ops, r.h.Applies-applies)
	}

	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsUDP, append(append([]model.Endpoint(nil), st.Endpoints.Get(dnsUDP)...), ready("10.244.2.5", 53, "node-c")))
	res = r.sync(t, next)
	if r.k.Ops-ops != 1 || res.Messages != 1 || r.h.Applies != applies || res.Full {
		t.Errorf("one new remote endpoint: %d ops, %+v, %d helper applies; want one NEW_DEST", r.k.Ops-ops, res, r.h.Applies-applies)
	}
	if r.helpers != 1 {
		t.Errorf("NewHelper called %d times, want once", r.helpers)
	}
	if len(r.asked) != 0 {
		t.Errorf("a sync was asked for at %v with nothing draining", r.asked)
	}
}

// A removed TCP endpoint drains: the backend asks the loop for a sync at
// the drain check, and the sync then deletes the idle server and stops
// asking.
func TestBackendDrainCheckScheduled(t *testing.T) {
	r := newBackendRig(t)
	st := demoState()
	r.sync(t, st)
	next := clone(st)
	next.Endpoints = next.Endpoints.With(dnsTCP, []model.Endpoint{ready("10.244.0.5", 53, node)}) // 10.244.1.5 goes
	r.k.SetConns(dnsVIP, remote, 1, 0)
	r.sync(t, next)
	if len(r.asked) != 1 || !r.asked[0].Equal(r.clk.t.Add(time.Minute)) {
		t.Fatalf("asked for syncs at %v, want one at the drain check a minute on", r.asked)
	}
	dests, _ := r.k.Dests(dnsVIP)
	if len(dests) != 2 {
		t.Fatalf("draining server gone at once: %v", dests)
	}
	r.k.SetConns(dnsVIP, remote, 0, 0)
	r.clk.advance(time.Minute)
	r.asked = nil
	r.sync(t, next)
	if dests, _ := r.k.Dests(dnsVIP); len(dests) != 1 {
		t.Errorf("idle draining server not deleted at the check: %v", dests)
	}
	if len(r.asked) != 0 {
		t.Errorf("still asking for syncs at %v with nothing draining", r.asked)
	}
}

// A changed node description gets a new helper (its rules depend on it).
func TestBackendNodeChangeNewHelper(t *testing.T) {
	r := newBackendRig(t)
	st := demoState()
	r.sync(t, st)
	next := clone(st)
	next.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}
	if res := r.sync(t, next); !res.Full || r.helpers != 2 {
		t.Errorf("node change: %+v, NewHelper called %d times; want a full sync with a new helper", res, r.helpers)
	}
}

// Cleanup removes the helpers' objects and every virtual server outside
// the excluded CIDRs.
func TestBackendCleanup(t *testing.T) {
	r := newBackendRig(t)
	r.sync(t, demoState())
	foreign := ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: ip("192.168.255.1"), Protocol: model.TCP, Port: 80}, Scheduler: "rr", Netmask: 0xffffffff}
	if errs, _ := r.k.Apply([]ipvsnl.Op{{Cmd: ipvsnl.CmdNewService, Service: foreign}}); errs != nil {
		t.Fatal(errs)
	}
	removed, err := r.b.Cleanup(context.Background())
	if err != nil || !removed {
		t.Fatalf("cleanup: %v, %v", removed, err)
	}
	if vs := r.k.Snapshot(); len(vs) != 1 || vs[0].ServiceKey != foreign.ServiceKey {
		t.Errorf("after cleanup the kernel holds %v, want only the excluded one", vs)
	}
	if r.cleaned != 1 || len(r.h.Addrs)+len(r.h.Elems) != 0 {
		t.Errorf("helper cleanup called %d times, %d objects left", r.cleaned, len(r.h.Addrs)+len(r.h.Elems))
	}
	if removed, err := r.b.Cleanup(context.Background()); err != nil || removed {
		t.Errorf("second cleanup: %v, %v; want nothing to remove", removed, err)
	}
	// A sync after the cleanup programs everything again.
	r.sync(t, demoState())
	if len(r.k.Snapshot()) < 2 {
		t.Errorf("nothing programmed after cleanup")
	}
}

func TestSysctls(t *testing.T) {
	root := t.TempDir()
	keys := []string{"net/ipv4/vs/conntrack", "net/ipv4/vs/expire_nodest_conn", "net/ipv4/vs/expire_quiescent_template",
		"net/ipv4/ip_forward", "net/ipv4/conf/all/arp_ignore", "net/ipv4/conf/all/arp_announce"}
	for _, k := range keys {
		p := filepath.Join(root, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := sysctl.New(root)
	if err := ApplySysctls(s, false, nil); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{keys[0]: 1, keys[1]: 1, keys[2]: 1, keys[3]: 1, keys[4]: 0, keys[5]: 0}
	for k, v := range want {
		if got, _ := s.GetInt(k); got != v {
			t.Errorf("without strict ARP: %s = %d, want %d", k, got, v)
		}
	}
	if err := ApplySysctls(s, true, nil); err != nil {
		t.Fatal(err)
	}
	if a, b := must(s.GetInt(keys[4])), must(s.GetInt(keys[5])); a != 1 || b != 2 {
		t.Errorf("strict ARP: arp_ignore %d, arp_announce %d; want 1 and 2", a, b)
	}
	// A kernel without IPVS has no net/ipv4/vs: a clear error naming the key.
	if err := ApplySysctls(sysctl.New(t.TempDir()), false, nil); err == nil {
		t.Error("missing keys: no error")
	}
}

func must(v int, _ error) int { return v }

// DeleteVirtualServers deletes what is outside the excluded CIDRs in one
// write and counts only the deletions that went; each failed one is in
// the error.
func TestDeleteVirtualServers(t *testing.T) {
	svc := func(addr string) ipvsnl.Service {
		return ipvsnl.Service{ServiceKey: ipvsnl.ServiceKey{Addr: ip(addr), Protocol: model.TCP, Port: 80}, Scheduler: "rr", Netmask: 0xffffffff}
	}
	k := ipvsnl.NewFakeKernel()
	var ops []ipvsnl.Op
	for _, a := range []string{"10.96.0.1", "10.96.0.2", "10.96.0.3", "192.168.255.1"} {
		ops = append(ops, ipvsnl.Op{Cmd: ipvsnl.CmdNewService, Service: svc(a)})
	}
	if errs, err := k.Apply(ops); errs != nil || err != nil {
		t.Fatal(errs, err)
	}
	k.Fail = func(op ipvsnl.Op) error {
		if op.Service.Addr == ip("10.96.0.2") {
			return syscall.EBUSY
		}
		return nil
	}
	writes := k.Writes
	n, err := DeleteVirtualServers(k, []netip.Prefix{netip.MustParsePrefix("192.168.255.0/24")})
	if n != 2 || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "10.96.0.2") {
		t.Errorf("deleted %d, %v; want 2 and an EBUSY error naming 10.96.0.2", n, err)
	}
	if k.Writes-writes != 1 {
		t.Errorf("%d writes, want 1", k.Writes-writes)
	}
	var left []string
	for _, v := range k.Snapshot() {
		left = append(left, v.Addr.String())
	}
	if !slices.Equal(left, []string{"10.96.0.2", "192.168.255.1"}) {
		t.Errorf("left %v, want the failed one and the excluded one", left)
	}
	k.Fail = nil
	if n, err := DeleteVirtualServers(k, nil); n != 2 || err != nil {
		t.Errorf("without exclusions: deleted %d, %v; want 2", n, err)
	}
}

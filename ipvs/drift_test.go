package ipvs

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// fakeMonitor is a change monitor the test marks by hand.
type fakeMonitor struct {
	mu      sync.Mutex
	changed map[nftlib.TableRef]bool
	all     bool
}

func (m *fakeMonitor) mark(tables ...nftlib.TableRef) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.changed == nil {
		m.changed = map[nftlib.TableRef]bool{}
	}
	for _, t := range tables {
		m.changed[t] = true
	}
}

func (m *fakeMonitor) Pending() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.changed) > 0 || m.all
}

func (m *fakeMonitor) Take() (map[nftlib.TableRef]bool, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, a := m.changed, m.all
	m.changed, m.all = nil, false
	return c, a
}

// driftRig is a backend rig that checks every minute and records OnDrift.
func driftRig(t *testing.T, mon ChangeMonitor) (*backendRig, map[string][]string) {
	r := newBackendRig(t)
	r.b.cfg.CheckEvery = time.Minute
	if mon != nil {
		r.b.cfg.Watch = func(func()) (ChangeMonitor, error) { return mon, nil }
	}
	drifts := map[string][]string{}
	r.b.cfg.OnDrift = func(table string, diffs []string) { drifts[table] = append(drifts[table], diffs...) }
	return r, drifts
}

// Virtual and real servers deleted or changed behind the backend's back
// (ipvsadm) are put back by the first sync after the check period, which
// reports them; a sync before it does not read IPVS back.
func TestBackendRepairsIPVSDrift(t *testing.T) {
	r, drifts := driftRig(t, nil)
	st := demoState()
	r.sync(t, st)
	want := r.k.Snapshot()
	web := want[0]
	for _, v := range want {
		if len(v.Dests) > 1 && v.ServiceKey != dnsVIP {
			web = v
			break
		}
	}
	dns := dnsVIP
	if errs, err := r.k.Apply([]ipvsnl.Op{
		{Cmd: ipvsnl.CmdDelService, Service: ipvsnl.Service{ServiceKey: dns}},
		{Cmd: ipvsnl.CmdDelDest, Service: web.Service, Dest: web.Dests[0]},
		{Cmd: ipvsnl.CmdSetDest, Service: web.Service, Dest: ipvsnl.Dest{Addr: web.Dests[1].Addr, Weight: 7}},
	}); errs != nil || err != nil {
		t.Fatal(errs, err)
	}
	r.sync(t, st)
	if len(drifts) != 0 || len(r.k.Snapshot()) == len(want) {
		t.Fatalf("repaired before the check was due: %v", drifts)
	}
	r.clk.advance(time.Minute)
	r.sync(t, st)
	if got := snapshotRules(r.k.Snapshot()); got != snapshotRules(want) {
		t.Errorf("after the check:\n%s\nwant\n%s", got, snapshotRules(want))
	}
	text := strings.Join(drifts["ipvs"], "\n")
	for _, w := range []string{"virtual server " + dns.String() + ": missing", web.Dests[0].Addr.String() + ": missing", "weight 7, want 1"} {
		if !strings.Contains(text, w) {
			t.Errorf("differences %q do not mention %q", text, w)
		}
	}
	// Repaired: the next check finds nothing.
	clear(drifts)
	r.clk.advance(time.Minute)
	r.sync(t, st)
	if len(drifts) != 0 {
		t.Errorf("a check after the repair found %v", drifts)
	}
}

func snapshotRules(vss []ipvsnl.VirtualServer) string {
	var b strings.Builder
	_ = WriteRules(&b, vss)
	return b.String()
}

// A helper element removed behind the backend's back is put back by the
// next sync when the change monitor saw the table change, without waiting
// for the check period; addresses are compared at the check period.
func TestBackendRepairsHelperDrift(t *testing.T) {
	mon := &fakeMonitor{}
	r, drifts := driftRig(t, mon)
	st := demoState()
	r.sync(t, st)
	var gone Element
	for e := range r.h.Elems {
		if !e.V6 && e.Set == SetClusterIP {
			gone = e
			break
		}
	}
	delete(r.h.Elems, gone)

	r.sync(t, st)
	if len(drifts) != 0 {
		t.Fatalf("checked without a change seen or the period passing: %v", drifts)
	}
	mon.mark(nftlib.TableRef{Family: nftlib.IPv4, Name: HelperTableName})
	r.sync(t, st)
	if !r.h.Elems[gone] {
		t.Errorf("element %s %s not repaired", gone.Set, gone)
	}
	if d := drifts["ip "+HelperTableName]; len(d) != 1 || !strings.Contains(d[0], "missing") {
		t.Errorf("differences %v, want the missing element", drifts)
	}

	addr := ip("10.96.0.10")
	delete(r.h.Addrs, addr)
	r.sync(t, st)
	if _, ok := drifts[ipvsnl.DummyName]; ok || r.h.Addrs[addr] {
		t.Errorf("addresses checked before the period: %v", drifts)
	}
	r.clk.advance(time.Minute)
	r.sync(t, st)
	if !r.h.Addrs[addr] || len(drifts[ipvsnl.DummyName]) != 1 {
		t.Errorf("address %s: present %v after the check, differences %v", addr, r.h.Addrs[addr], drifts)
	}
}

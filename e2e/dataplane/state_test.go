package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

func TestState(t *testing.T) {
	pod := netip.MustParseAddr("10.244.0.10")
	st, tg, err := State(100, pod)
	if err != nil {
		t.Fatal(err)
	}
	if st.Services.Len() != 100 || st.Endpoints.Len() != 100 {
		t.Fatalf("%d services, %d endpoint lists, want 100 each", st.Services.Len(), st.Endpoints.Len())
	}
	ips := map[netip.Addr]bool{}
	real := map[model.Protocol]netip.AddrPort{}
	for name, svc := range st.Services.All() {
		ip := svc.ClusterIPs[0]
		if ips[ip] || !netip.MustParsePrefix("10.96.0.0/16").Contains(ip) {
			t.Errorf("%v: ClusterIP %v duplicate or outside 10.96.0.0/16", name, ip)
		}
		ips[ip] = true
		eps := st.Endpoints.Get(name)
		if len(eps) != Endpoints {
			t.Errorf("%v: %d endpoints, want %d", name, len(eps), Endpoints)
		}
		if eps[0].Addr == pod {
			if _, dup := real[svc.Protocol]; dup {
				t.Errorf("two %s Services point at the pod", svc.Protocol)
			}
			real[svc.Protocol] = netip.AddrPortFrom(ip, svc.Port)
			for j, ep := range eps {
				if ep.Addr != pod || ep.Port != uint16(BackendPort+j) {
					t.Errorf("%v: endpoint %d is %v, want %v:%d", name, j, ep, pod, BackendPort+j)
				}
			}
		}
	}
	if real[model.TCP] != tg.TCP || real[model.UDP] != tg.UDP {
		t.Errorf("targets %+v, the Services pointing at the pod %v", tg, real)
	}
	for _, n := range []int{1, MaxServices + 1} {
		if _, _, err := State(n, pod); err == nil {
			t.Errorf("State(%d) did not fail", n)
		}
	}
}

func TestSummarise(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	got := Summarise(ds)
	want := Stats{N: 100, P50: 50 * time.Microsecond, P90: 90 * time.Microsecond, P99: 99 * time.Microsecond}
	if got != want {
		t.Errorf("Summarise = %+v, want %+v", got, want)
	}
	if ds[0] != 100*time.Microsecond {
		t.Error("Summarise sorted its argument")
	}
	if got.String() != "50.0 / 90.0 / 99.0" {
		t.Errorf("String = %q", got.String())
	}
}

func TestCheck(t *testing.T) {
	src := netip.MustParseAddr("10.244.0.11")
	dst := netip.MustParseAddrPort("10.96.0.51:80")
	good := Reply{Backend: "ep-8003", Source: netip.AddrPortFrom(src, 40000), From: dst}
	wanted := []string{"ep-8000", "ep-8003"}
	if err := Check(good, wanted, src, dst, true); err != nil {
		t.Errorf("good reply: %v", err)
	}
	for name, r := range map[string]Reply{
		"wrong backend": {Backend: "ep-8001", Source: good.Source, From: dst},
		"masqueraded":   {Backend: "ep-8003", Source: netip.MustParseAddrPort("10.244.0.1:40000"), From: dst},
		"not un-DNATed": {Backend: "ep-8003", Source: good.Source, From: netip.MustParseAddrPort("10.244.0.10:8003")},
	} {
		if err := Check(r, wanted, src, dst, true); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

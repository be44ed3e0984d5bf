package nft

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

func affinityState() *model.State {
	st := demoState()
	for name, svc := range st.Services.All() {
		svc := *svc
		svc.AffinityTimeout = 10800 * time.Second
		st.Services = st.Services.With(name, &svc)
	}
	return st
}

func webSEP(ep string) string {
	return EndpointChain(model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}, model.TCP, ep)
}

// The tracer follows the affinity set: a first connection may go to either
// endpoint and records the client's affinity to the one chosen; a client
// with affinity goes back to that endpoint, from the ClusterIP and the
// NodePort alike (upstream keeps one affinity per service port, whatever
// the address used), and still gets the hairpin masquerade when that
// endpoint is itself.
func TestTraceAffinity(t *testing.T) {
	rs := Build(affinityState(), demoConfig())
	node := []netip.Addr{mustAddr("10.99.0.1"), mustAddr("fd00:99::1")}
	pod, podA, outside := mustAddr("10.244.0.20"), mustAddr("10.244.0.10"), mustAddr("10.99.0.2")
	idA, idB := nftlib.StickyID(webSEP("10.244.0.10:8080")), nftlib.StickyID(webSEP("10.244.0.11:8080"))
	tests := []struct {
		name string
		pkt  nftlib.Packet
		want []string
	}{
		{"first connection: either endpoint, affinity recorded",
			nftlib.Packet{Src: pod, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node},
			[]string{fmt.Sprintf("0.500 dnat 10.244.0.10:8080 affinity %d", idA), fmt.Sprintf("0.500 dnat 10.244.0.11:8080 affinity %d", idB)}},
		{"affinity to pod-b: pod-b only, refreshed",
			nftlib.Packet{Src: pod, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node, Sticky: []uint32{idB}},
			[]string{fmt.Sprintf("1.000 dnat 10.244.0.11:8080 affinity %d", idB)}},
		{"affinity from the ClusterIP holds for the NodePort",
			nftlib.Packet{Src: outside, Dst: mustAddr("10.99.0.1"), Proto: unix.IPPROTO_TCP, Dport: 30080, Local: node, Sticky: []uint32{idA}},
			[]string{fmt.Sprintf("1.000 dnat 10.244.0.10:8080 masquerade affinity %d", idA)}},
		{"hairpin on the affinity path is masqueraded",
			nftlib.Packet{Src: podA, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node, Sticky: []uint32{idA}},
			[]string{fmt.Sprintf("1.000 dnat 10.244.0.10:8080 masquerade affinity %d", idA)}},
		{"affinity to an endpoint of another service does not apply",
			nftlib.Packet{Src: pod, Dst: mustAddr("10.96.0.10"), Proto: unix.IPPROTO_TCP, Dport: 80, Local: node, Sticky: []uint32{12345}},
			[]string{fmt.Sprintf("0.500 dnat 10.244.0.10:8080 affinity %d", idA), fmt.Sprintf("0.500 dnat 10.244.0.11:8080 affinity %d", idB)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, o := range mustTrace(t, rs, tt.pkt) {
				s := o.String()
				s = s[:strings.Index(s, " via ")]
				if o.Sticky != 0 {
					s += fmt.Sprintf(" affinity %d", o.Sticky)
				}
				got = append(got, s)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
	// Without affinity nothing is recorded.
	for _, o := range mustTrace(t, Build(demoState(), demoConfig()), tests[0].pkt) {
		if o.Sticky != 0 {
			t.Errorf("a Service without affinity recorded one: %v", o)
		}
	}
}

// Affinity service ports live in the affinity table from the first sync on
// and stay there through changes and folds, and a full sync keeps the
// set's elements: clients keep their affinities.
func TestKernelAffinityKept(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	b := openTestBackend(t, ns, demoConfig())
	st := affinityState()
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	id := nftlib.StickyID(webSEP("10.244.0.11:8080"))
	testns.NFT(t, ns, "add", "element", "ip", DefaultTableName+affinitySuffix, setAffinity,
		fmt.Sprintf("{ 10.244.0.20 . %d timeout 1h }", id))
	elements := func() string {
		return testns.NFT(t, ns, "list", "set", "ip", DefaultTableName+affinitySuffix, setAffinity)
	}
	if !strings.Contains(elements(), fmt.Sprint(id)) {
		t.Fatalf("element not added:\n%s", elements())
	}
	// A change elsewhere, a fold (a sync with nothing to do), a full sync.
	changed := shallowCopy(st)
	plain := model.ServicePortName{Namespace: "default", Name: "plain", Port: "p"}
	changed.Services = changed.Services.With(plain, &model.ServicePort{Name: plain, Protocol: model.TCP, Port: 81, ClusterIPs: []netip.Addr{mustAddr("10.96.0.81")}})
	changed.Endpoints = changed.Endpoints.With(plain, []model.Endpoint{{Addr: mustAddr("10.244.0.12"), Port: 80, Ready: true, Serving: true}})
	for i, s := range []*model.State{changed, changed, changed} {
		if i == 2 {
			b.ForceFull()
		}
		if _, err := b.Sync(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(elements(), fmt.Sprint(id)) {
			t.Fatalf("sync %d lost the client's affinity:\n%s", i, elements())
		}
		for _, other := range []string{DefaultTableName, DefaultTableName + deltaSuffix} {
			list := testns.NFT(t, ns, "list", "table", "ip", other)
			if strings.Contains(list, "@affinity") || strings.Contains(list, webSEP("10.244.0.11:8080")) {
				t.Fatalf("sync %d: the affinity service is in %s:\n%s", i, other, list)
			}
		}
	}
}

package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/conntrack"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/serve"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// BenchmarkKernelEndToEndChange is one endpoint change along the proxy's
// whole path, in process: a Builder holds n Services x 10 endpoints (the
// shape of scaleState), programmed by a full sync; each iteration upserts
// one changed EndpointSlice, takes the snapshot (StateWithTriggers, as the
// sync loop does), syncs it into the kernel, and runs what the proxy runs
// after each applied sync (health check node ports, the no-local-endpoints
// metric, the conntrack cleaner). Alternating with each change, the
// kernel's smallest commit (one empty chain added or deleted) on the same
// ruleset: the floor any change pays. Medians, in ms.
func BenchmarkKernelEndToEndChange(b *testing.B) {
	for _, n := range benchSizes(b, 1000, 10000) {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchEndToEnd(b, n) })
	}
}

func benchEndToEnd(b *testing.B, n int) {
	bl := kube.NewBuilder("node-1")
	for i := range n {
		if err := bl.UpsertService(e2eService(i)); err != nil {
			b.Fatal(err)
		}
		if err := bl.UpsertEndpointSlice(e2eSlice(i, 0)); err != nil {
			b.Fatal(err)
		}
	}
	ns := testns.New(b, "knp-nft-")
	// The drift check's monitor listens, as in the proxy.
	be := openTestBackendWith(b, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Hour})
	after := newAfterSync()
	st, _ := bl.StateWithTriggers()
	if _, err := be.Sync(context.Background(), st); err != nil {
		b.Fatal(err)
	}
	after(st)
	advance := fakeClock(be)
	var snapshot, sync, kernel, afterSync, total, floor []time.Duration
	add := true
	for gen := 1; b.Loop(); gen++ {
		advance(staleChainAge) // changes come at least a second apart
		slice := e2eSlice(gen%64*(n/64), gen)
		start := time.Now()
		if err := bl.UpsertEndpointSlice(slice); err != nil {
			b.Fatal(err)
		}
		st, _ := bl.StateWithTriggers()
		t1 := time.Now()
		res, err := be.Sync(context.Background(), st)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		after(st)
		t3 := time.Now()
		if res.Full {
			b.Fatal("a one-Service change made a full sync")
		}
		snapshot, sync, afterSync = append(snapshot, t1.Sub(start)), append(sync, t2.Sub(t1)), append(afterSync, t3.Sub(t2))
		total, kernel = append(total, t3.Sub(start)), append(kernel, res.Kernel)
		floor = append(floor, commitFloor(b, be, add))
		add = !add
	}
	ms := func(ds []time.Duration) float64 { return median(ds).Seconds() * 1000 }
	b.ReportMetric(ms(snapshot), "snapshot-ms")
	b.ReportMetric(ms(sync), "sync-ms")
	b.ReportMetric(ms(kernel), "kernel-ms")
	b.ReportMetric(ms(afterSync), "after-ms")
	b.ReportMetric(ms(total), "total-ms")
	b.ReportMetric(ms(floor), "floor-ms")
	b.ReportMetric(ms(total)/ms(floor), "x-floor")
}

// newAfterSync returns what the proxy runs with each applied State
// (cmd/kube-nftproxy's OnApplied): nothing here serves a health check
// node port or is UDP, as in scaleState.
func newAfterSync() func(*model.State) {
	hc := &serve.HealthChecks{Host: "127.0.0.1"}
	m := serve.NewMetrics()
	cl := &conntrack.Cleaner{Table: noFlows{}, LocalAddrs: func() ([]netip.Addr, error) { return nil, nil }}
	return func(st *model.State) {
		hc.Update(st)
		m.CountNoLocalEndpoints(st)
		if _, err := cl.Clean(st); err != nil {
			panic(err)
		}
	}
}

type noFlows struct{}

func (noFlows) List(uint8, uint8) ([]conntrack.Flow, error) { return nil, nil }
func (noFlows) Delete([]conntrack.Flow) (int, error)        { return 0, nil }

// commitFloor times the smallest transaction: one empty chain added to (or
// deleted from) the IPv4 delta table.
func commitFloor(b *testing.B, be *Backend, add bool) time.Duration {
	bt := be.kern().NewTx()
	if add {
		bt.AddChains(nftlib.IPv4, DefaultTableName+deltaSuffix, []*nftlib.Chain{{Name: "floor"}})
	} else {
		bt.DelChain(nftlib.IPv4, DefaultTableName+deltaSuffix, "floor")
	}
	start := time.Now()
	if err := be.kern().CommitTx(bt); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	return took
}

// e2eService is Service i of scaleState as the API server hands it out.
func e2eService(i int) *corev1.Service {
	ip := netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)}).String()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "p", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	if i < 2000 { // the NodePort range holds 2768
		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = int32(30000 + i)
	}
	return svc
}

// e2eSlice is the EndpointSlice of Service i: 10 ready endpoints on this
// node; gen (a round of changes) moves the first one.
func e2eSlice(i, gen int) *discoveryv1.EndpointSlice {
	port, proto, name, node, ready := int32(8000), corev1.ProtocolTCP, "p", "node-1", true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: fmt.Sprintf("svc-%d-abcde", i),
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := range 10 {
		v := uint32(i)<<4 | uint32(j) // distinct addresses in 10.128.0.0/9
		addr := netip.AddrFrom4([4]byte{10, 128 | byte(v>>16), byte(v >> 8), byte(v)})
		if j == 0 && gen > 0 {
			addr = netip.AddrFrom4([4]byte{10, 250, byte(gen >> 8), byte(gen)})
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr.String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return es
}

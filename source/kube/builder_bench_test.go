package kube

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchSizes are the cluster sizes the Builder benchmarks run at.
var benchSizes = []int{10_000, 40_000, 50_000}

// benchService is NodePort Service i of a large cluster: every address and
// node port distinct, so nothing conflicts unless a benchmark makes it.
func benchService(i int) *corev1.Service {
	ip := netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)}).String()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeNodePort,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: int32(1 + i%65535),
			}},
		},
	}
}

// benchSlice is the EndpointSlice of Service i: three endpoints, whose
// addresses move with round's parity.
func benchSlice(i, round int) *discoveryv1.EndpointSlice {
	port, proto, name := int32(8080), corev1.ProtocolTCP, "http"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: fmt.Sprintf("svc-%d-abcde", i),
			Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}
	for j := range 3 {
		addr := netip.AddrFrom4([4]byte{10, byte(64 + 2*j + round%2), byte(i >> 8), byte(i)}).String()
		node := fmt.Sprintf("node-%d", (i+j)%100)
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &node})
	}
	return es
}

// benchBuilder holds n Services with one slice each, snapshot taken.
func benchBuilder(b *testing.B, n int) *Builder {
	b.Helper()
	bl := NewBuilder("node-1")
	for i := range n {
		if err := bl.UpsertService(benchService(i)); err != nil {
			b.Fatal(err)
		}
		if err := bl.UpsertEndpointSlice(benchSlice(i, 0)); err != nil {
			b.Fatal(err)
		}
	}
	if st := bl.State(); st.Services.Len() != n {
		b.Fatalf("state has %d services, want %d", st.Services.Len(), n)
	}
	return bl
}

// BenchmarkBuilderStateAfterServiceChange is the steady state of a large
// cluster: one Service changes, then the sync loop takes a snapshot. Every
// change makes or ends a conflict: the changed Service asks for its
// neighbour's NodePort and, in turn, gives it back.
func BenchmarkBuilderStateAfterServiceChange(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			bl := benchBuilder(b, n)
			const changes = 64
			var taking, giving [changes]*corev1.Service
			for i := range changes {
				j := i * (n / changes)
				taking[i], giving[i] = benchService(j), benchService(j)
				taking[i].Spec.Ports[0].NodePort = benchService(j + 1).Spec.Ports[0].NodePort
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				svc := taking[i/2%changes]
				if i%2 == 1 {
					svc = giving[i/2%changes]
				}
				if err := bl.UpsertService(svc); err != nil {
					b.Fatal(err)
				}
				if st := bl.State(); st.Services.Len() != n {
					b.Fatalf("state has %d services", st.Services.Len())
				}
			}
			b.StopTimer()
			if errs := bl.Errors(); len(errs) > 1 {
				b.Fatalf("%d conflicts left: %v", len(errs), errs[0])
			}
		})
	}
}

// BenchmarkBuilderStateAfterSliceChange: one EndpointSlice changes, then a
// snapshot is taken.
func BenchmarkBuilderStateAfterSliceChange(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			bl := benchBuilder(b, n)
			const changes = 64
			var sliceObjs [2 * changes]*discoveryv1.EndpointSlice
			for i := range sliceObjs {
				sliceObjs[i] = benchSlice(i%changes*(n/changes), i/changes+1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := bl.UpsertEndpointSlice(sliceObjs[i%len(sliceObjs)]); err != nil {
					b.Fatal(err)
				}
				if st := bl.State(); st.Services.Len() != n {
					b.Fatalf("state has %d services", st.Services.Len())
				}
			}
		})
	}
}

// BenchmarkBuilderFirstState is start-up's: every Service and slice of a
// first listing handled, then the first snapshot, which publishes them all.
func BenchmarkBuilderFirstState(b *testing.B) {
	for _, n := range []int{10_000, 50_000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := make([]*corev1.Service, n), make([]*discoveryv1.EndpointSlice, n)
			for i := range n {
				svcs[i], slices[i] = benchService(i), benchSlice(i, 0)
			}
			for b.Loop() {
				b.StopTimer()
				bl := NewBuilder("node-1")
				for i := range n {
					if err := bl.UpsertService(svcs[i]); err != nil {
						b.Fatal(err)
					}
					if err := bl.UpsertEndpointSlice(slices[i]); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if st := bl.State(); st.Services.Len() != n {
					b.Fatalf("state has %d services, want %d", st.Services.Len(), n)
				}
			}
		})
	}
}

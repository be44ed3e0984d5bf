package apisource

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// The API source follows creates, updates and deletes, and ignores what
// kube-proxy ignores. A fake clientset stands in for the API server here;
// e2e tests run it against a real one.
func TestAPISource(t *testing.T) {
	ptr := func(b bool) *bool { return &b }
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	other := svc.DeepCopy()
	other.Name, other.Spec.ClusterIP, other.Spec.ClusterIPs = "other", "10.96.0.11", []string{"10.96.0.11"}
	other.Labels = map[string]string{kube.LabelServiceProxyName: "someone-else"}
	port, proto := int32(8080), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptrStr("http"), Port: &port, Protocol: &proto}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
	client := fake.NewSimpleClientset(svc, other, slice, node)

	b := kube.NewBuilder("node-1")
	changes := make(chan struct{}, 100)
	src := &APISource{Client: client, Builder: b, OnChange: func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// The first OnChange comes once every listed object reached the Builder.
	select {
	case <-changes:
	case <-time.After(10 * time.Second):
		t.Fatal("OnChange was never called after the first listing")
	}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	if st := b.State(); st.Services.Get(web) == nil || len(st.Endpoints.Get(web)) != 1 || st.Node.Zone != "zone-a" {
		t.Fatalf("at the first OnChange the Builder lacks listed objects: %+v", st)
	}
	waitState(t, b, "the first listing", func(st *model.State) bool {
		return st.Services.Get(web) != nil && len(st.Endpoints.Get(web)) == 1 && st.Node.Zone == "zone-a"
	})
	if st := b.State(); st.Services.Get(model.ServicePortName{Namespace: "default", Name: "other", Port: "http"}) != nil {
		t.Errorf("a Service labelled %s was taken", kube.LabelServiceProxyName)
	}

	slice2 := slice.DeepCopy()
	slice2.Endpoints[0].Addresses = []string{"10.244.0.11"}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, "the endpoint update", func(st *model.State) bool {
		eps := st.Endpoints.Get(web)
		return len(eps) == 1 && eps[0].Addr.String() == "10.244.0.11"
	})
	if err := client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, "the deletion", func(st *model.State) bool { return st.Services.Get(web) == nil })
}

func ptrStr(s string) *string { return &s }

func waitState(t *testing.T, b *kube.Builder, what string, ok func(*model.State) bool) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, what, func() bool { return ok(b.State()) })
}

// A typed handler passes objects of its type on, from a tombstone too,
// skips others, and hands upsert's error to warn.
func TestTypedHandler(t *testing.T) {
	var upserted, removed []string
	var warned []error
	bad := errors.New("bad node")
	h := typedHandler(nil, func(err error) {
		if err != nil {
			warned = append(warned, err)
		}
	}, func(n *corev1.Node) error {
		upserted = append(upserted, n.Name)
		if n.Name == "bad" {
			return bad
		}
		return nil
	}, func(n *corev1.Node) { removed = append(removed, n.Name) })
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	h.upsert(node("a"))
	h.upsert(node("bad"))
	h.upsert(&corev1.Service{})
	h.remove(node("b"))
	h.remove(cache.DeletedFinalStateUnknown{Key: "c", Obj: node("c")})
	h.remove(cache.DeletedFinalStateUnknown{Key: "x", Obj: &corev1.Service{}})
	if !slices.Equal(upserted, []string{"a", "bad"}) || !slices.Equal(removed, []string{"b", "c"}) ||
		len(warned) != 1 || !errors.Is(warned[0], bad) {
		t.Errorf("upserted %v, removed %v, warned %v; want [a bad], [b c] and the bad node's error", upserted, removed, warned)
	}
}

package apisource

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// servesServiceCIDRs makes the fake's discovery list the resource.
func servesServiceCIDRs(c *fake.Clientset) {
	c.Resources = append(c.Resources, &metav1.APIResourceList{GroupVersion: networkingv1.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}}})
}

// runSource runs an APISource on client until the test ends and returns
// its Builder once the first OnChange came, and how long that took.
func runSource(t *testing.T, client *fake.Clientset, onError func(error)) (*kube.Builder, time.Duration) {
	t.Helper()
	b := kube.NewBuilder("node-1")
	first := make(chan struct{})
	var once sync.Once
	src := &APISource{Client: client, Builder: b, OnError: onError, OnChange: func() { once.Do(func() { close(first) }) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("OnChange was never called after the first listing")
	}
	return b, time.Since(start)
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// ServiceCIDRs are listed before the first sync and followed after it.
func TestAPISourceServiceCIDRs(t *testing.T) {
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}
	client := fake.NewSimpleClientset(sc)
	servesServiceCIDRs(client)
	b, _ := runSource(t, client, nil)
	if got := b.State().ServiceCIDRs; !slices.Equal(got, prefixes("10.96.0.0/16")) {
		t.Errorf("at the first OnChange ServiceCIDRs are %v, want 10.96.0.0/16", got)
	}
	sc2 := sc.DeepCopy()
	sc2.Spec.CIDRs = append(sc2.Spec.CIDRs, "fd00:10:96::/112")
	if _, err := client.NetworkingV1().ServiceCIDRs().Update(context.Background(), sc2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, "the update", func(st *model.State) bool {
		return slices.Equal(st.ServiceCIDRs, prefixes("10.96.0.0/16", "fd00:10:96::/112"))
	})
	if err := client.NetworkingV1().ServiceCIDRs().Delete(context.Background(), "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, "the deletion", func(st *model.State) bool { return len(st.ServiceCIDRs) == 0 })
}

// An API server that does not serve ServiceCIDRs, or does not let us list
// them, holds the first sync back serviceCIDRWait at most, and its refusal
// is not the API server's failure.
func TestAPISourceServiceCIDRsUnavailable(t *testing.T) {
	t.Run("not served", func(t *testing.T) {
		b, took := runSource(t, fake.NewSimpleClientset(), func(err error) { t.Errorf("OnError: %v", err) })
		if took > serviceCIDRWait/2 || len(b.State().ServiceCIDRs) != 0 {
			t.Errorf("first change after %v with ServiceCIDRs %v", took, b.State().ServiceCIDRs)
		}
	})
	t.Run("forbidden", func(t *testing.T) {
		client := fake.NewSimpleClientset()
		servesServiceCIDRs(client)
		client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}, "", nil)
		})
		b, took := runSource(t, client, func(err error) { t.Errorf("OnError: %v", err) })
		if took > serviceCIDRWait+2*time.Second || len(b.State().ServiceCIDRs) != 0 {
			t.Errorf("first change after %v with ServiceCIDRs %v", took, b.State().ServiceCIDRs)
		}
	})
}

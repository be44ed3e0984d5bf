package kube

import (
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// The State carries the union of the ServiceCIDR objects' ranges, masked,
// sorted, once each; a range stays while any object holds it; a snapshot
// says when they changed; a range that does not parse is reported and the
// others kept.
func TestBuilderServiceCIDRs(t *testing.T) {
	b := NewBuilder("node-1")
	steps := []struct {
		what    string
		do      func() error
		want    []string
		changed bool
		wantErr bool
	}{
		{"none yet", func() error { return nil }, nil, false, false},
		{"kubernetes", func() error {
			return b.UpsertServiceCIDR(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"))
		}, []string{"10.96.0.0/16", "fd00:10:96::/112"}, true, false},
		{"a second object, one range shared, one unmasked", func() error {
			return b.UpsertServiceCIDR(serviceCIDR("extra", "10.97.0.5/16", "10.96.0.0/16"))
		}, []string{"10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112"}, true, false},
		{"the same again", func() error { return b.UpsertServiceCIDR(serviceCIDR("extra", "10.96.0.0/16", "10.97.0.0/16")) }, []string{"10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112"}, false, false},
		{"kubernetes goes: the shared range stays", func() error { b.DeleteServiceCIDR("kubernetes"); return nil }, []string{"10.96.0.0/16", "10.97.0.0/16"}, true, false},
		{"a bad range", func() error { return b.UpsertServiceCIDR(serviceCIDR("extra", "10.97.0.0/16", "not-a-cidr")) }, []string{"10.97.0.0/16"}, true, true},
		{"gone", func() error { b.DeleteServiceCIDR("extra"); return nil }, []string{}, true, false},
	}
	var prev *model.State
	for _, s := range steps {
		if err := s.do(); (err != nil) != s.wantErr {
			t.Errorf("%s: error %v, want one: %v", s.what, err, s.wantErr)
		}
		st := b.State()
		var want []netip.Prefix
		for _, c := range s.want {
			want = append(want, netip.MustParsePrefix(c))
		}
		if !slices.Equal(st.ServiceCIDRs, want) {
			t.Errorf("%s: ServiceCIDRs %v, want %v", s.what, st.ServiceCIDRs, want)
		}
		switch {
		case !s.changed && st != prev && st.Changes.ServiceCIDRsChanged:
			t.Errorf("%s: a new snapshot says the ServiceCIDRs changed", s.what)
		case s.changed && (st == prev || !st.Changes.ServiceCIDRsChanged):
			t.Errorf("%s: no new snapshot saying the ServiceCIDRs changed", s.what)
		}
		prev = st
		if s.wantErr != (len(b.Errors()) > 0) {
			t.Errorf("%s: Builder errors %v", s.what, b.Errors())
		}
	}
}

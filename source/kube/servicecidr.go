package kube

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// ServiceCIDR objects (networking.k8s.io/v1, cluster-scoped) name the
// ranges ClusterIPs are allocated from. The State carries the union of
// their spec.cidrs (model.State.ServiceCIDRs), whatever their status, as
// upstream kube-proxy hands its nftables proxier every object's cidrs;
// unlike upstream's, a range two objects share stays while either holds it.

// serviceCIDRKind names ServiceCIDRs in the Builder's per-object errors.
const serviceCIDRKind = "servicecidr"

// UpsertServiceCIDR records a ServiceCIDR's ranges; a range that does not
// parse is skipped and reported.
func (b *Builder) UpsertServiceCIDR(sc *networkingv1.ServiceCIDR) error {
	if sc == nil {
		return nil
	}
	var cidrs []netip.Prefix
	var errs []error
	for _, s := range sc.Spec.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("spec.cidrs %q: %w", s, err))
			continue
		}
		cidrs = append(cidrs, p.Masked())
	}
	err := errors.Join(errs...)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setErr(objectRef{serviceCIDRKind, "", sc.Name}, err)
	if b.serviceCIDRs == nil {
		b.serviceCIDRs = map[string][]netip.Prefix{}
	}
	b.serviceCIDRs[sc.Name] = cidrs
	b.mergeServiceCIDRs()
	return err
}

// DeleteServiceCIDR forgets a ServiceCIDR's ranges.
func (b *Builder) DeleteServiceCIDR(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.errs, objectRef{serviceCIDRKind, "", name})
	if _, ok := b.serviceCIDRs[name]; !ok {
		return
	}
	delete(b.serviceCIDRs, name)
	b.mergeServiceCIDRs()
}

// mergeServiceCIDRs recomputes the union of the objects' ranges (sorted,
// without repeats); a new snapshot follows when it changed.
func (b *Builder) mergeServiceCIDRs() {
	var all []netip.Prefix
	for _, cidrs := range b.serviceCIDRs {
		all = append(all, cidrs...)
	}
	slices.SortFunc(all, comparePrefixes)
	all = slices.Compact(all)
	if slices.Equal(all, b.cidrs) {
		return
	}
	b.cidrs = all
	b.cidrsChanged = true
	b.snap = nil
}

func comparePrefixes(a, c netip.Prefix) int {
	if n := a.Addr().Compare(c.Addr()); n != 0 {
		return n
	}
	return a.Bits() - c.Bits()
}

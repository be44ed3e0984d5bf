package ipvs

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"syscall"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
)

// FakeHelper holds kube-ipvs0's addresses and the helper sets in memory.
type FakeHelper struct {
	Addrs map[netip.Addr]bool
	Elems map[Element]bool
	// Fail, when set, fails Apply.
	Fail    func(HelperChange) error
	Journal *[]string
	Applies int
}

var _ Helper = (*FakeHelper)(nil)

// NewFakeHelper returns a helper with no addresses and no elements.
func NewFakeHelper() *FakeHelper {
	return &FakeHelper{Addrs: map[netip.Addr]bool{}, Elems: map[Element]bool{}}
}

// Read returns the addresses and elements.
func (h *FakeHelper) Read() ([]netip.Addr, []Element, error) {
	return slices.Collect(maps.Keys(h.Addrs)), slices.Collect(maps.Keys(h.Elems)), nil
}

// Apply adds, then removes; adding what is there or removing what is not
// fails, as `ip addr add` and nft (without "create"/"destroy") do.
func (h *FakeHelper) Apply(c HelperChange) error {
	h.Applies++
	if h.Fail != nil {
		if err := h.Fail(c); err != nil {
			return err
		}
	}
	for _, a := range c.AddAddrs {
		if h.Addrs[a] {
			return fmt.Errorf("address %s: %w", a, syscall.EEXIST)
		}
		h.Addrs[a] = true
		h.log("add-addr " + a.String())
	}
	for _, e := range c.AddElems {
		h.Elems[e] = true
	}
	for _, e := range c.DelElems {
		delete(h.Elems, e)
	}
	for _, a := range c.DelAddrs {
		if !h.Addrs[a] {
			return fmt.Errorf("address %s: %w", a, syscall.EADDRNOTAVAIL)
		}
		delete(h.Addrs, a)
		h.log("del-addr " + a.String())
	}
	return nil
}

func (h *FakeHelper) log(s string) {
	if h.Journal != nil {
		*h.Journal = append(*h.Journal, s)
	}
}

var _ DriftChecker = (*FakeHelper)(nil)

// Drift compares the fake's addresses and elements with what was applied,
// as NftHelper does with the kernel's.
func (h *FakeHelper) Drift(addrs []netip.Addr, elems iter.Seq[Element], scope DriftScope) (map[string][]string, error) {
	out := map[string][]string{}
	if scope.Addrs {
		if d := addrDrift(addrs, slices.Collect(maps.Keys(h.Addrs))); len(d) > 0 {
			out[ipvsnl.DummyName] = d
		}
	}
	for _, v6 := range []bool{false, true} {
		if (v6 && !scope.IPv6) || (!v6 && !scope.IPv4) {
			continue
		}
		var d []string
		want := map[Element]bool{}
		for e := range elems {
			if e.V6 == v6 {
				want[e] = true
				if !h.Elems[e] {
					d = append(d, "set "+e.Set+": element "+e.String()+" missing")
				}
			}
		}
		for e := range h.Elems {
			if e.V6 == v6 && !want[e] {
				d = append(d, "set "+e.Set+": element "+e.String()+" is not ours")
			}
		}
		if len(d) > 0 {
			name := "ip " + HelperTableName
			if v6 {
				name = "ip6 " + HelperTableName
			}
			slices.Sort(d)
			out[name] = d
		}
	}
	return out, nil
}

package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// AddrLink holds kube-ipvs0's addresses. Dummy is the real one.
type AddrLink interface {
	Addrs() ([]netip.Addr, error)
	AddAddrs([]netip.Addr) error
	DelAddrs([]netip.Addr) error
}

// NftHelper is the real Helper: the helper table of each family, written
// through the nft package's transaction writer, and kube-ipvs0's addresses
// through an AddrLink (nil: none, where the kernel has no dummy links).
type NftHelper struct {
	k      *nftlib.Kernel
	tables []*nftlib.SetTable // ip, ip6; their Elements are not used
	link   AddrLink
}

var _ Helper = (*NftHelper)(nil)

// NewNftHelper returns a helper that programs through k and link. cfg and
// node shape the constant rules (masquerade bit and detect-local).
func NewNftHelper(k *nftlib.Kernel, cfg proxier.Settings, node proxier.Node, link AddrLink) *NftHelper {
	return &NftHelper{k: k, tables: HelperTables(cfg, node, nil), link: link}
}

// Read adopts what the kernel holds: the addresses on kube-ipvs0 and the
// elements of every helper set whose type is ours. It then rewrites both
// tables with those elements in one transaction, so that the rules are
// ours (a newer version's, or repaired) and sets of another type are
// replaced; what it returns is exactly what the tables then hold.
func (h *NftHelper) Read() ([]netip.Addr, []Element, error) {
	var addrs []netip.Addr
	if h.link != nil {
		a, err := h.link.Addrs()
		if err != nil {
			return nil, nil, fmt.Errorf("reading kube-ipvs0 addresses: %w", err)
		}
		addrs = a
	}
	var elems []Element
	write := make([]*nftlib.SetTable, len(h.tables))
	for i, t := range h.tables {
		got, _, err := h.k.ReadSetTable(t)
		if err != nil {
			return nil, nil, err
		}
		w := *t
		w.Elements = got
		write[i] = &w
		for set, ses := range got {
			for _, se := range ses {
				elems = append(elems, fromSetElement(set, t.Family == nftlib.IPv6, se))
			}
		}
	}
	if err := h.k.ReplaceSetTables(write...); err != nil {
		return nil, nil, fmt.Errorf("writing the helper tables: %w", err)
	}
	return addrs, elems, nil
}

// Apply adds addresses, changes elements in one transaction (adds, then
// deletes), then deletes addresses.
func (h *NftHelper) Apply(c HelperChange) error {
	if h.link != nil && len(c.AddAddrs) > 0 {
		if err := h.link.AddAddrs(c.AddAddrs); err != nil {
			return fmt.Errorf("adding kube-ipvs0 addresses: %w", err)
		}
	} else if h.link == nil && len(c.AddAddrs)+len(c.DelAddrs) > 0 {
		return fmt.Errorf("%d kube-ipvs0 address changes but no link to hold them", len(c.AddAddrs)+len(c.DelAddrs))
	}
	if err := h.k.ApplySetElements(h.elementChanges(c)); err != nil {
		return fmt.Errorf("changing helper set elements: %w", err)
	}
	if h.link != nil && len(c.DelAddrs) > 0 {
		if err := h.link.DelAddrs(c.DelAddrs); err != nil {
			return fmt.Errorf("deleting kube-ipvs0 addresses: %w", err)
		}
	}
	return nil
}

// elementChanges groups a change's elements by table and set: additions
// first, then deletions.
func (h *NftHelper) elementChanges(c HelperChange) []nftlib.SetElementChange {
	type tableSet struct {
		v6  bool
		set string
	}
	var out []nftlib.SetElementChange
	for _, del := range []bool{false, true} {
		elems := c.AddElems
		if del {
			elems = c.DelElems
		}
		// Counted first: each set's list is made once, at its size (a
		// full sync's are a hundred thousand elements).
		count := map[tableSet]int{}
		for _, e := range elems {
			count[tableSet{e.V6, e.Set}]++
		}
		at := map[tableSet]int{}
		for _, e := range elems {
			k := tableSet{e.V6, e.Set}
			i, ok := at[k]
			if !ok {
				t := h.tables[0]
				if e.V6 {
					t = h.tables[1]
				}
				i = len(out)
				at[k] = i
				out = append(out, nftlib.SetElementChange{Table: t, Set: e.Set, Delete: del, Elements: make([]nftlib.SetElement, 0, count[k])})
			}
			out[i].Elements = append(out[i].Elements, setElement(e))
		}
	}
	return out
}

package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// Helper holds what IPVS needs around it: kube-ipvs0's addresses (so the
// virtual addresses are local and reach IPVS in INPUT) and the elements of
// the helper table's sets (masquerade and filter rules read them).
type Helper interface {
	// Read returns the addresses on kube-ipvs0 and the sets' elements.
	Read() ([]netip.Addr, []Element, error)
	// Apply adds, then removes. After an error the Syncer reads again.
	Apply(c HelperChange) error
}

// HelperChange is one sync's change to the Helper.
type HelperChange struct {
	AddAddrs, DelAddrs []netip.Addr
	AddElems, DelElems []Element
}

func (c HelperChange) empty() bool {
	return len(c.AddAddrs)+len(c.DelAddrs)+len(c.AddElems)+len(c.DelElems) == 0
}

// AddrLink holds kube-ipvs0's addresses. ipvsnl.Dummy is the real one.
type AddrLink interface {
	Addrs() ([]netip.Addr, error)
	AddAddrs([]netip.Addr) error
	DelAddrs([]netip.Addr) error
}

var _ AddrLink = (*ipvsnl.Dummy)(nil)

// NftHelper is the real Helper: the helper table of each family (an
// nftlib.Table of plain sets), written through nftlib's transactions, and
// kube-ipvs0's addresses through an AddrLink (nil: none, where the kernel
// has no dummy links).
type NftHelper struct {
	k      *nftlib.Kernel
	tables []*nftlib.Table // ip, ip6; empty: only the sets' and chains' shape is used
	link   AddrLink
}

var _ Helper = (*NftHelper)(nil)

// NewNftHelper returns a helper that programs through k and link. cfg and
// node shape the constant rules (masquerade bit and detect-local).
func NewNftHelper(k *nftlib.Kernel, cfg proxier.Settings, node model.Node, link AddrLink) *NftHelper {
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
	tx := h.k.NewTx()
	var setID uint32
	for _, t := range h.tables {
		got, err := h.readTable(t)
		if err != nil {
			h.k.DiscardTx(tx)
			return nil, nil, err
		}
		replace, _ := nftlib.FullTx(got.table, got.kernel, true)
		replace.Write(tx, &setID)
		for _, m := range got.table.Maps {
			for _, se := range m.Elements {
				elems = append(elems, fromSetElement(m.Name, t.Family == nftlib.IPv6, se))
			}
		}
	}
	if err := h.k.CommitTx(tx); err != nil {
		return nil, nil, fmt.Errorf("writing the helper tables: %w", err)
	}
	return addrs, elems, nil
}

// readHelper is what the kernel holds of a helper table: the table as
// the kernel describes it, and ours holding the elements of every set of
// our type.
type readHelper struct {
	kernel *nftlib.KernelTable
	table  *nftlib.Table
}

// readTable reads one helper table's sets, chains and elements back.
func (h *NftHelper) readTable(t *nftlib.Table) (readHelper, error) {
	kts, err := h.k.ReadFamily(t.Family, []string{t.Name}, nil) // chains dumped family-wide: a helper table is small
	if err != nil {
		return readHelper{}, err
	}
	kt := kts[t.Name]
	got, err := h.k.ReadElements(t, kt)
	if err != nil {
		return readHelper{}, err
	}
	w := withElements(t, got)
	return readHelper{kernel: kt, table: w}, nil
}

// withElements is a copy of t whose sets hold elems, by set name.
func withElements(t *nftlib.Table, elems map[string][]nftlib.Element) *nftlib.Table {
	w := *t
	w.Maps = make([]*nftlib.Map, len(t.Maps))
	for i, m := range t.Maps {
		c := *m
		c.Elements = elems[m.Name]
		w.Maps[i] = &c
	}
	return &w
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
	if err := h.applyElements(h.elementChanges(c)); err != nil {
		return fmt.Errorf("changing helper set elements: %w", err)
	}
	if h.link != nil && len(c.DelAddrs) > 0 {
		if err := h.link.DelAddrs(c.DelAddrs); err != nil {
			return fmt.Errorf("deleting kube-ipvs0 addresses: %w", err)
		}
	}
	return nil
}

// elementChange adds elements to, or deletes them from, one helper set.
type elementChange struct {
	table    *nftlib.Table
	set      string
	delete   bool
	elements []nftlib.Element
}

// applyElements applies element changes, in order, in one transaction:
// all of them or, when the kernel refuses one (an element deleted that is
// not there), none.
func (h *NftHelper) applyElements(changes []elementChange) error {
	tx := h.k.NewTx()
	for _, c := range changes {
		if len(c.elements) == 0 {
			continue
		}
		m := c.table.Map(c.set)
		if m == nil {
			h.k.DiscardTx(tx)
			return fmt.Errorf("table %s %s has no set %q", c.table.Family, c.table.Name, c.set)
		}
		tx.Elements(!c.delete, c.table.Family, c.table.Name, m, c.elements)
	}
	if tx.Messages() == 0 {
		h.k.DiscardTx(tx)
		return nil
	}
	return h.k.CommitTx(tx)
}

// elementChanges groups a change's elements by table and set: additions
// first, then deletions.
func (h *NftHelper) elementChanges(c HelperChange) []elementChange {
	type tableSet struct {
		v6  bool
		set string
	}
	var out []elementChange
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
				out = append(out, elementChange{table: t, set: e.Set, delete: del, elements: make([]nftlib.Element, 0, count[k])})
			}
			out[i].elements = append(out[i].elements, setElement(e))
		}
	}
	return out
}

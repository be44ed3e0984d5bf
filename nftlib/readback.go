package nftlib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// KernelTable is what the kernel holds of one of our tables, as far as the
// metadata goes: its chains and sets, and the stateful objects and
// flowtables that only another process puts there (all the kinds of
// object a table can hold).
type KernelTable struct {
	Exists bool
	use    uint32 // the kernel's count of the table's chains, sets, objects and flowtables
	Flags  uint32
	Owner  uint32 // the netlink port id of an owner-flagged table's owner
	udata  []byte
	Chains map[string]*kernelChain
	Sets   map[string]*kernelSet
	objs   []kernelObject
	// flowtables are the names of the table's flowtables.
	flowtables []string
	// stateful is set once objs and flowtables were read.
	stateful bool
}

// counted is how many of the objects the table's use count counts were read.
func (kt *KernelTable) counted() int {
	return len(kt.Chains) + len(kt.Sets) + len(kt.objs) + len(kt.flowtables)
}

// kernelChain is a chain's attributes as the kernel reports them.
type kernelChain struct {
	Base     bool
	typ      string
	hook     uint32
	priority int32
	policy   uint32
	Flags    uint32
	udata    []byte
}

// binding reports an anonymous chain (nft's `jump { ... }`): it belongs to
// the rule that jumps to it, and goes with that rule.
func (kc *kernelChain) binding() bool { return kc.Flags&NftChainBinding != 0 }

// kernelSet is a set's or map's attributes as the kernel reports them.
type kernelSet struct {
	Flags, KeyType, KeyLen, DataType, dataLen uint32
	Udata                                     []byte
}

// anonymous reports a set or map of one rule (nft's `{ ... }` and
// `vmap { ... }`): it goes with the rule, and cannot be deleted alone.
func (ks *kernelSet) anonymous() bool { return ks.Flags&unix.NFT_SET_ANONYMOUS != 0 }

// kernelObject is a stateful object (counter, quota, ct helper, limit...).
type kernelObject struct {
	Type uint32 // NFT_OBJECT_*
	Name string
}

// objectKinds are nft's names of the object types (NFT_OBJECT_*).
var objectKinds = map[uint32]string{
	1: "counter", 2: "quota", 3: "ct helper", 4: "limit", 5: "connlimit",
	6: "tunnel", 7: "ct timeout", 8: "secmark", 9: "ct expectation", 10: "synproxy",
}

func (o kernelObject) kind() string {
	if n, ok := objectKinds[o.Type]; ok {
		return n
	}
	return fmt.Sprintf("object of type %d", o.Type)
}

// ReadFamily reads the metadata of the named tables of family f; a table
// the kernel does not have comes back with exists false. expect, when it
// has a table's name, lists the chains that table should hold: they are
// asked for by name. A table's use count says whether it holds more than
// that: then its objects and flowtables are read (one small dump each)
// and, when some are still unaccounted for, its chains are dumped
// family-wide (the kernel has no per-table filter for a chain dump, so
// that costs the chains of every table of the family).
func (k *Kernel) ReadFamily(f Family, names []string, expect map[string][]string) (map[string]*KernelTable, error) {
	out, err := k.readTables(f, names)
	if err != nil {
		return nil, err
	}
	dumpAll := false
	for name, kt := range out {
		if !kt.Exists {
			continue
		}
		if err := k.readSets(f, name, kt); err != nil {
			return nil, err
		}
		want, ok := expect[name]
		if !ok {
			dumpAll = true
			continue
		}
		if err := k.getChains(f, name, want, kt.Chains); err != nil {
			return nil, fmt.Errorf("reading chains of %s %s: %w", f, name, err)
		}
		if err := k.readStatefulIfUncounted(f, name, kt); err != nil {
			return nil, err
		}
		dumpAll = dumpAll || kt.counted() != int(kt.use) // chains we did not ask for
	}
	if !dumpAll {
		return out, nil
	}
	if err := k.dumpFamilyChains(f, out); err != nil {
		return nil, err
	}
	for name, kt := range out {
		if kt.Exists && !kt.stateful {
			if err := k.readStatefulIfUncounted(f, name, kt); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// TableInfo reads one table's attributes (flags, owner, comment), not what
// it holds; Exists is false when the kernel has no such table.
func (k *Kernel) TableInfo(f Family, name string) (*KernelTable, error) {
	kts, err := k.readTables(f, []string{name})
	if err != nil {
		return nil, err
	}
	return kts[name], nil
}

// Comment is the table's comment, "" without one.
func (kt *KernelTable) Comment() string { return udataComment(kt.udata) }

// readTables reads the attributes of the named tables of family f.
func (k *Kernel) readTables(f Family, names []string) (map[string]*KernelTable, error) {
	out := make(map[string]*KernelTable, len(names))
	for _, n := range names {
		out[n] = &KernelTable{Chains: map[string]*kernelChain{}, Sets: map[string]*kernelSet{}}
	}
	err := k.dump(unix.NFT_MSG_GETTABLE, f, nil, func(p []byte) error {
		var name string
		var t KernelTable
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_TABLE_NAME:
				name = a.str()
			case unix.NFTA_TABLE_FLAGS:
				t.Flags = a.u32()
			case unix.NFTA_TABLE_USE:
				t.use = a.u32()
			case nftaTableOwner:
				t.Owner = a.u32()
			case nftaTableUserdata:
				t.udata = clone(a.data)
			}
		})
		if kt := out[name]; kt != nil {
			kt.Exists, kt.Flags, kt.use, kt.Owner, kt.udata = true, t.Flags, t.use, t.Owner, t.udata
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", f, err)
	}
	return out, nil
}

// readSets reads the attributes of a table's sets and maps.
func (k *Kernel) readSets(f Family, name string, kt *KernelTable) error {
	err := k.dump(unix.NFT_MSG_GETSET, f, func(m *batch) { m.str(unix.NFTA_SET_TABLE, name) }, func(p []byte) error {
		var set string
		s := &kernelSet{}
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_SET_NAME:
				set = a.str()
			case unix.NFTA_SET_FLAGS:
				s.Flags = a.u32()
			case unix.NFTA_SET_KEY_TYPE:
				s.KeyType = a.u32()
			case unix.NFTA_SET_KEY_LEN:
				s.KeyLen = a.u32()
			case unix.NFTA_SET_DATA_TYPE:
				s.DataType = a.u32()
			case unix.NFTA_SET_DATA_LEN:
				s.dataLen = a.u32()
			case unix.NFTA_SET_USERDATA:
				s.Udata = clone(a.data)
			}
		})
		kt.Sets[set] = s
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing sets of %s %s: %w", f, name, err)
	}
	return nil
}

// dumpFamilyChains replaces the chains read of each table with a dump of
// every chain of the family.
func (k *Kernel) dumpFamilyChains(f Family, out map[string]*KernelTable) error {
	for _, kt := range out {
		clear(kt.Chains)
	}
	err := k.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(p []byte) error {
		table, name, c := parseChain(p)
		if kt := out[table]; kt != nil {
			kt.Chains[name] = c
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing %s chains: %w", f, err)
	}
	return nil
}

// readStatefulIfUncounted reads a table's objects and flowtables when its
// use count says it holds more than the chains and sets read: our tables
// have none, so this costs nothing until another process adds some.
func (k *Kernel) readStatefulIfUncounted(f Family, name string, kt *KernelTable) error {
	if kt.counted() >= int(kt.use) {
		return nil
	}
	return k.readStateful(f, name, kt)
}

// readStateful reads a table's objects and flowtables.
func (k *Kernel) readStateful(f Family, name string, kt *KernelTable) error {
	kt.stateful = true
	err := k.dump(unix.NFT_MSG_GETOBJ, f, func(m *batch) { m.str(unix.NFTA_OBJ_TABLE, name) }, func(p []byte) error {
		var o kernelObject
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_OBJ_NAME:
				o.Name = a.str()
			case unix.NFTA_OBJ_TYPE:
				o.Type = a.u32()
			}
		})
		kt.objs = append(kt.objs, o)
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing objects of %s %s: %w", f, name, err)
	}
	err = k.dump(unix.NFT_MSG_GETFLOWTABLE, f, func(m *batch) { m.str(nftaFlowtableTable, name) }, func(p []byte) error {
		forAttrs(p, func(a nlAttr) {
			if a.typ == nftaFlowtableName {
				kt.flowtables = append(kt.flowtables, a.str())
			}
		})
		return nil
	})
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) { // a kernel without flowtables has none
		return fmt.Errorf("listing flowtables of %s %s: %w", f, name, err)
	}
	return nil
}

// parseChain reads a chain message's table, name and attributes.
func parseChain(p []byte) (table, name string, c *kernelChain) {
	c = &kernelChain{}
	forAttrs(p, func(a nlAttr) {
		switch a.typ {
		case unix.NFTA_CHAIN_TABLE:
			table = a.str()
		case unix.NFTA_CHAIN_NAME:
			name = a.str()
		case unix.NFTA_CHAIN_HOOK:
			c.Base = true
			forAttrs(a.data, func(h nlAttr) {
				switch h.typ {
				case unix.NFTA_HOOK_HOOKNUM:
					c.hook = h.u32()
				case unix.NFTA_HOOK_PRIORITY:
					c.priority = int32(h.u32())
				}
			})
		case unix.NFTA_CHAIN_POLICY:
			c.policy = a.u32()
		case unix.NFTA_CHAIN_TYPE:
			c.typ = a.str()
		case nftaChainFlags:
			c.Flags = a.u32()
		case nftaChainUserdata:
			c.udata = clone(a.data)
		}
	})
	return table, name, c
}

// getChainsBatch is how many chains getChains asks for per sendmsg: their
// answers must fit the receive buffer, or the kernel drops them.
const getChainsBatch = 256

// getChains asks for the named chains of a table, many requests per
// message, and puts those the kernel has into chains.
func (k *Kernel) getChains(f Family, table string, names []string, chains map[string]*kernelChain) error {
	if k.dumpBuf == nil {
		k.dumpBuf = make([]byte, 64<<10)
	}
	for len(names) > 0 {
		n := min(len(names), getChainsBatch)
		var req []byte
		first := k.seq
		for _, name := range names[:n] {
			m, _ := k.request(unix.NFT_MSG_GETCHAIN, 0, f, func(m *batch) {
				m.str(unix.NFTA_CHAIN_TABLE, table)
				m.str(unix.NFTA_CHAIN_NAME, name)
			})
			req = append(req, m...)
		}
		names = names[n:]
		if err := unix.Sendto(k.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("asking for chains: %w", err)
		}
		for answered := 0; answered < n; {
			got, _, err := unix.Recvfrom(k.fd, k.dumpBuf, 0)
			if err != nil {
				if errors.Is(err, unix.EINTR) {
					continue
				}
				return fmt.Errorf("reading chains: %w", err)
			}
			msgs, err := syscall.ParseNetlinkMessage(k.dumpBuf[:got])
			if err != nil {
				return fmt.Errorf("parsing chains: %w", err)
			}
			for _, m := range msgs {
				if m.Header.Seq-first >= uint32(n) {
					continue // a late answer to something else
				}
				answered++
				if m.Header.Type == unix.NLMSG_ERROR {
					if len(m.Data) < 4 {
						return errors.New("reading chains: short error")
					}
					if errno := syscall.Errno(-int32(binary.NativeEndian.Uint32(m.Data))); errno != 0 && errno != unix.ENOENT {
						return errno
					}
					continue
				}
				if len(m.Data) < NfgenLen {
					continue
				}
				if t, name, c := parseChain(m.Data[NfgenLen:]); t == table {
					chains[name] = c
				}
			}
		}
	}
	return nil
}

// dumpChainRules calls fn with each rule of one chain of a table ("" for
// all, chain by chain in order): the chain's name, the
// NFTA_RULE_EXPRESSIONS payload and the userdata. The kernel
// resumes a dump that spans several 32 KiB messages by walking the table's
// rules from the first again, which makes a table-wide dump quadratic in
// its rules; one dump per chain stays linear.
func (k *Kernel) dumpChainRules(f Family, table, chain string, fn func(chain string, exprs, udata []byte)) error {
	attrs := func(m *batch) {
		m.str(unix.NFTA_RULE_TABLE, table)
		if chain != "" {
			m.str(unix.NFTA_RULE_CHAIN, chain)
		}
	}
	err := k.dump(unix.NFT_MSG_GETRULE, f, attrs, func(p []byte) error {
		var chain string
		var exprs, udata []byte
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_RULE_CHAIN:
				chain = a.str()
			case unix.NFTA_RULE_EXPRESSIONS:
				exprs = a.data
			case unix.NFTA_RULE_USERDATA:
				udata = a.data
			}
		})
		fn(chain, exprs, udata)
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing rules of %s %s: %w", f, table, err)
	}
	return nil
}

// kElement is one map element as the kernel reports it.
type kElement struct {
	key, end, udata []byte
	verdict         int32
	chain           string
}

// dumpElements calls fn with each element of a map.
func (k *Kernel) dumpElements(f Family, table, set string, fn func(e kElement)) error {
	return k.dumpRawElements(f, table, set, func(el []byte) { fn(parseElement(el)) })
}

// dumpRawElements calls fn with the attributes of each element of a set.
func (k *Kernel) dumpRawElements(f Family, table, set string, fn func(el []byte)) error {
	attrs := func(m *batch) {
		m.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		m.str(unix.NFTA_SET_ELEM_LIST_SET, set)
	}
	err := k.dump(unix.NFT_MSG_GETSETELEM, f, attrs, func(p []byte) error {
		forAttrs(p, func(a nlAttr) {
			if a.typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return
			}
			forAttrs(a.data, func(el nlAttr) { fn(el.data) })
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing elements of %s %s %s: %w", f, table, set, err)
	}
	return nil
}

func parseElement(b []byte) kElement {
	var e kElement
	forAttrs(b, func(a nlAttr) {
		switch a.typ {
		case unix.NFTA_SET_ELEM_KEY:
			dataValue(a.data, func(v []byte) { e.key = v })
		case nftaSetElemKeyEnd:
			dataValue(a.data, func(v []byte) { e.end = v })
		case unix.NFTA_SET_ELEM_DATA:
			forAttrs(a.data, func(d nlAttr) {
				if d.typ != unix.NFTA_DATA_VERDICT {
					return
				}
				forAttrs(d.data, func(v nlAttr) {
					switch v.typ {
					case unix.NFTA_VERDICT_CODE:
						e.verdict = int32(binary.BigEndian.Uint32(v.data))
					case unix.NFTA_VERDICT_CHAIN:
						e.chain = v.str()
					}
				})
			})
		case unix.NFTA_SET_ELEM_USERDATA:
			e.udata = a.data
		}
	})
	return e
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

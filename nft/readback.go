package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// kTable is what the kernel holds of one of our tables, as far as the
// metadata goes (tables, chains and sets: one dump each per family).
type kTable struct {
	exists bool
	use    uint32 // the kernel's count of the table's chains, sets, objects and flowtables
	flags  uint32
	owner  uint32 // the netlink port id of an owner-flagged table's owner
	udata  []byte
	chains map[string]*kChain
	sets   map[string]*kSet
}

// kChain is a chain's attributes as the kernel reports them.
type kChain struct {
	base     bool
	typ      string
	hook     uint32
	priority int32
	policy   uint32
	flags    uint32
	udata    []byte
}

// kSet is a set's or map's attributes as the kernel reports them.
type kSet struct {
	flags, keyType, keyLen, dataType, dataLen uint32
	udata                                     []byte
}

// readFamily reads the metadata of the named tables of family f; a table
// the kernel does not have comes back with exists false. expect, when it
// has a table's name, lists the chains that table should hold: they are
// asked for by name, and when the table's use count says it holds more
// objects than found, its chains are dumped family-wide instead (the
// kernel has no per-table filter for a chain dump, so that costs the
// chains of every table of the family).
func (k *Kernel) readFamily(f Family, names []string, expect map[string][]string) (map[string]*kTable, error) {
	out := make(map[string]*kTable, len(names))
	for _, n := range names {
		out[n] = &kTable{chains: map[string]*kChain{}, sets: map[string]*kSet{}}
	}
	err := k.dump(unix.NFT_MSG_GETTABLE, f, nil, func(p []byte) error {
		var name string
		var t kTable
		forAttrs(p, func(a nlAttr) {
			switch a.typ {
			case unix.NFTA_TABLE_NAME:
				name = a.str()
			case unix.NFTA_TABLE_FLAGS:
				t.flags = a.u32()
			case unix.NFTA_TABLE_USE:
				t.use = a.u32()
			case nftaTableOwner:
				t.owner = a.u32()
			case nftaTableUserdata:
				t.udata = clone(a.data)
			}
		})
		if kt := out[name]; kt != nil {
			kt.exists, kt.flags, kt.use, kt.owner, kt.udata = true, t.flags, t.use, t.owner, t.udata
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", f, err)
	}
	for name, kt := range out {
		if !kt.exists {
			continue
		}
		err := k.dump(unix.NFT_MSG_GETSET, f, func(m *batch) { m.str(unix.NFTA_SET_TABLE, name) }, func(p []byte) error {
			var set string
			s := &kSet{}
			forAttrs(p, func(a nlAttr) {
				switch a.typ {
				case unix.NFTA_SET_NAME:
					set = a.str()
				case unix.NFTA_SET_FLAGS:
					s.flags = a.u32()
				case unix.NFTA_SET_KEY_TYPE:
					s.keyType = a.u32()
				case unix.NFTA_SET_KEY_LEN:
					s.keyLen = a.u32()
				case unix.NFTA_SET_DATA_TYPE:
					s.dataType = a.u32()
				case unix.NFTA_SET_DATA_LEN:
					s.dataLen = a.u32()
				case unix.NFTA_SET_USERDATA:
					s.udata = clone(a.data)
				}
			})
			kt.sets[set] = s
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing sets of %s %s: %w", f, name, err)
		}
	}
	dumpAll := false
	for name, kt := range out {
		want, ok := expect[name]
		if !kt.exists {
			continue
		}
		if !ok {
			dumpAll = true
			continue
		}
		if err := k.getChains(f, name, want, kt.chains); err != nil {
			return nil, fmt.Errorf("reading chains of %s %s: %w", f, name, err)
		}
		if int(kt.use) != len(kt.chains)+len(kt.sets) {
			dumpAll = true // chains we did not ask for, or objects
		}
	}
	if !dumpAll {
		return out, nil
	}
	for _, kt := range out {
		clear(kt.chains)
	}
	err = k.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(p []byte) error {
		table, name, c := parseChain(p)
		if kt := out[table]; kt != nil {
			kt.chains[name] = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s chains: %w", f, err)
	}
	return out, nil
}

// parseChain reads a chain message's table, name and attributes.
func parseChain(p []byte) (table, name string, c *kChain) {
	c = &kChain{}
	forAttrs(p, func(a nlAttr) {
		switch a.typ {
		case unix.NFTA_CHAIN_TABLE:
			table = a.str()
		case unix.NFTA_CHAIN_NAME:
			name = a.str()
		case unix.NFTA_CHAIN_HOOK:
			c.base = true
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
			c.flags = a.u32()
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
func (k *Kernel) getChains(f Family, table string, names []string, chains map[string]*kChain) error {
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
		k.dumps++
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
				if len(m.Data) < nfgenLen {
					continue
				}
				if t, name, c := parseChain(m.Data[nfgenLen:]); t == table {
					chains[name] = c
				}
			}
		}
	}
	return nil
}

// dumpRules calls fn with each rule of a table, chain by chain in order:
// the chain's name, the NFTA_RULE_EXPRESSIONS payload and the userdata.
func (k *Kernel) dumpRules(f Family, table string, fn func(chain string, exprs, udata []byte)) error {
	return k.dumpChainRules(f, table, "", fn)
}

// dumpChainRules is dumpRules for one chain ("" for all). The kernel
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
	key, udata []byte
	verdict    int32
	chain      string
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
			forAttrs(a.data, func(v nlAttr) {
				if v.typ == unix.NFTA_DATA_VALUE {
					e.key = v.data
				}
			})
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

package model

import (
	"hash/maphash"
	"iter"
	"math/bits"
	"slices"
)

// PortMap is an immutable map keyed by service port name: a hash array
// mapped trie, so that a map made from another by a few changes shares
// all but the paths to the changed entries with it. A State's maps are
// PortMaps: the next State costs what changed, and a consumer holding an
// old State never sees later changes. The zero value is empty.
//
// Iteration order is that of the (per-process) hashes: sort where order
// matters (State.SortedNames).
type PortMap[V any] struct {
	root *pmNode[V]
	n    int
}

// pmBits is how many bits of a key's hash each level of the trie uses.
const pmBits = 6

// pmSeed hashes the keys; random per process, so that no one can choose
// Service names that collide.
var pmSeed = maphash.MakeSeed()

func pmHash(k ServicePortName) uint64 { return maphash.Comparable(pmSeed, k) }

// pmNode is one level of the trie: a slot for each set bit of bitmap, in
// bit order. Below the last level (all the hash used), a node lists the
// keys whose hashes collide, bitmap unused. edit marks a node that the
// PortMapEditor holding that token made, and may change in place.
type pmNode[V any] struct {
	bitmap uint64
	slots  []pmSlot[V]
	edit   *pmEdit
}

// pmSlot holds either a subtree or one entry.
type pmSlot[V any] struct {
	child *pmNode[V]
	leaf  *pmLeaf[V]
}

type pmLeaf[V any] struct {
	hash uint64
	key  ServicePortName
	val  V
}

// pmEdit identifies one editing session of a PortMapEditor (by address).
type pmEdit struct{ _ byte }

// Len is the number of entries.
func (m PortMap[V]) Len() int { return m.n }

// Get returns the value of k (the zero value if absent).
func (m PortMap[V]) Get(k ServicePortName) V {
	v, _ := m.Lookup(k)
	return v
}

// Lookup returns the value of k and whether k is present.
func (m PortMap[V]) Lookup(k ServicePortName) (V, bool) { return m.lookup(pmHash(k), k) }

func (m PortMap[V]) lookup(h uint64, k ServicePortName) (V, bool) {
	n := m.root
	for shift := uint(0); n != nil; shift += pmBits {
		if shift >= 64 {
			for _, s := range n.slots {
				if s.leaf.key == k {
					return s.leaf.val, true
				}
			}
			break
		}
		bit := uint64(1) << (h >> shift & 63)
		if n.bitmap&bit == 0 {
			break
		}
		s := n.slots[bits.OnesCount64(n.bitmap&(bit-1))]
		if s.leaf != nil {
			if s.leaf.key == k {
				return s.leaf.val, true
			}
			break
		}
		n = s.child
	}
	var zero V
	return zero, false
}

// All iterates over the entries, in no particular order.
func (m PortMap[V]) All() iter.Seq2[ServicePortName, V] {
	return func(yield func(ServicePortName, V) bool) {
		m.root.walk(yield)
	}
}

// Keys iterates over the keys, in no particular order.
func (m PortMap[V]) Keys() iter.Seq[ServicePortName] {
	return func(yield func(ServicePortName) bool) {
		m.root.walk(func(k ServicePortName, _ V) bool { return yield(k) })
	}
}

func (n *pmNode[V]) walk(yield func(ServicePortName, V) bool) bool {
	if n == nil {
		return true
	}
	for _, s := range n.slots {
		if s.leaf != nil {
			if !yield(s.leaf.key, s.leaf.val) {
				return false
			}
		} else if !s.child.walk(yield) {
			return false
		}
	}
	return true
}

// SortedKeys lists the keys in ServicePortName.Compare order.
func (m PortMap[V]) SortedKeys() []ServicePortName {
	out := make([]ServicePortName, 0, m.n)
	for k := range m.Keys() {
		out = append(out, k)
	}
	slices.SortFunc(out, ServicePortName.Compare)
	return out
}

// With returns m with k set to v; m is unchanged. For many changes, use
// an editor (Edit), which copies each path once.
func (m PortMap[V]) With(k ServicePortName, v V) PortMap[V] {
	e := m.Edit()
	e.Set(k, v)
	return e.Map()
}

// Without returns m without k; m is unchanged.
func (m PortMap[V]) Without(k ServicePortName) PortMap[V] {
	e := m.Edit()
	e.Delete(k)
	return e.Map()
}

// PortMapFrom returns a PortMap holding the entries of a Go map.
func PortMapFrom[V any](src map[ServicePortName]V) PortMap[V] {
	var e PortMapEditor[V]
	for k, v := range src {
		e.Set(k, v)
	}
	return e.Map()
}

// PortMapEditor changes a PortMap in place until Map hands it out: the
// nodes it copied are its own and change without further copies; Map
// freezes them (later changes copy again), so every PortMap it returned
// stays as it was. The zero value edits an empty map. Not safe for
// concurrent use.
type PortMapEditor[V any] struct {
	m    PortMap[V]
	edit *pmEdit
}

// Edit returns an editor starting from m.
func (m PortMap[V]) Edit() *PortMapEditor[V] { return &PortMapEditor[V]{m: m} }

// Len is the number of entries.
func (e *PortMapEditor[V]) Len() int { return e.m.n }

// Get returns the value of k (the zero value if absent).
func (e *PortMapEditor[V]) Get(k ServicePortName) V { return e.m.Get(k) }

// Map returns the map as edited so far. It costs nothing: the editor's
// next change copies the nodes on its path instead of changing them.
func (e *PortMapEditor[V]) Map() PortMap[V] {
	e.edit = nil
	return e.m
}

// Set sets k to v.
func (e *PortMapEditor[V]) Set(k ServicePortName, v V) { e.setHashed(pmHash(k), k, v) }

func (e *PortMapEditor[V]) setHashed(h uint64, k ServicePortName, v V) {
	if e.edit == nil {
		e.edit = new(pmEdit)
	}
	leaf := &pmLeaf[V]{hash: h, key: k, val: v}
	root := e.m.root
	if root == nil {
		root = &pmNode[V]{edit: e.edit}
	}
	var added bool
	e.m.root, added = e.set(root, 0, leaf)
	if added {
		e.m.n++
	}
}

// Delete removes k, if present.
func (e *PortMapEditor[V]) Delete(k ServicePortName) { e.deleteHashed(pmHash(k), k) }

func (e *PortMapEditor[V]) deleteHashed(h uint64, k ServicePortName) {
	if e.m.root == nil {
		return
	}
	if e.edit == nil {
		e.edit = new(pmEdit)
	}
	root, removed := e.del(e.m.root, 0, h, k)
	if !removed {
		return
	}
	e.m.n--
	if e.m.n == 0 {
		root = nil
	}
	e.m.root = root
}

// own returns n, or a copy of it the editor may change.
func (e *PortMapEditor[V]) own(n *pmNode[V]) *pmNode[V] {
	if n.edit == e.edit {
		return n
	}
	return &pmNode[V]{bitmap: n.bitmap, slots: slices.Clone(n.slots), edit: e.edit}
}

// set puts leaf in the subtree n at level shift; it returns the subtree's
// new root and whether the key is new.
func (e *PortMapEditor[V]) set(n *pmNode[V], shift uint, leaf *pmLeaf[V]) (*pmNode[V], bool) {
	if shift >= 64 {
		return e.setCollision(n, leaf)
	}
	bit := uint64(1) << (leaf.hash >> shift & 63)
	i := bits.OnesCount64(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		n = e.own(n)
		n.bitmap |= bit
		n.slots = slices.Insert(n.slots, i, pmSlot[V]{leaf: leaf})
		return n, true
	}
	s := n.slots[i]
	switch {
	case s.child != nil:
		child, added := e.set(s.child, shift+pmBits, leaf)
		if child != s.child {
			n = e.own(n)
			n.slots[i].child = child
		}
		return n, added
	case s.leaf.key == leaf.key:
		n = e.own(n)
		n.slots[i].leaf = leaf
		return n, false
	}
	n = e.own(n)
	n.slots[i] = pmSlot[V]{child: e.pair(shift+pmBits, s.leaf, leaf)}
	return n, true
}

func (e *PortMapEditor[V]) setCollision(n *pmNode[V], leaf *pmLeaf[V]) (*pmNode[V], bool) {
	n = e.own(n)
	for i, s := range n.slots {
		if s.leaf.key == leaf.key {
			n.slots[i].leaf = leaf
			return n, false
		}
	}
	n.slots = append(n.slots, pmSlot[V]{leaf: leaf})
	return n, true
}

// pair makes the subtree at level shift holding two leaves.
func (e *PortMapEditor[V]) pair(shift uint, a, b *pmLeaf[V]) *pmNode[V] {
	n := &pmNode[V]{edit: e.edit}
	if shift >= 64 {
		n.slots = []pmSlot[V]{{leaf: a}, {leaf: b}}
		return n
	}
	ba, bb := a.hash>>shift&63, b.hash>>shift&63
	switch {
	case ba == bb:
		n.bitmap = 1 << ba
		n.slots = []pmSlot[V]{{child: e.pair(shift+pmBits, a, b)}}
	case ba < bb:
		n.bitmap = 1<<ba | 1<<bb
		n.slots = []pmSlot[V]{{leaf: a}, {leaf: b}}
	default:
		n.bitmap = 1<<ba | 1<<bb
		n.slots = []pmSlot[V]{{leaf: b}, {leaf: a}}
	}
	return n
}

// del removes k from the subtree n at level shift. A subtree left with a
// single entry is replaced by that entry, so that a map's shape depends
// on its keys alone (Diff relies on it to skip what two maps share).
func (e *PortMapEditor[V]) del(n *pmNode[V], shift uint, h uint64, k ServicePortName) (*pmNode[V], bool) {
	if shift >= 64 {
		for i, s := range n.slots {
			if s.leaf.key == k {
				n = e.own(n)
				n.slots = slices.Delete(n.slots, i, i+1)
				return n, true
			}
		}
		return n, false
	}
	bit := uint64(1) << (h >> shift & 63)
	if n.bitmap&bit == 0 {
		return n, false
	}
	i := bits.OnesCount64(n.bitmap & (bit - 1))
	s := n.slots[i]
	if s.leaf != nil {
		if s.leaf.key != k {
			return n, false
		}
		n = e.own(n)
		n.bitmap &^= bit
		n.slots = slices.Delete(n.slots, i, i+1)
		return n, true
	}
	child, removed := e.del(s.child, shift+pmBits, h, k)
	if !removed {
		return n, false
	}
	n = e.own(n)
	if len(child.slots) == 1 && child.slots[0].leaf != nil {
		n.slots[i] = child.slots[0] // the lone entry moves up
	} else {
		n.slots[i].child = child
	}
	return n, true
}

// DiffKeys yields the keys present in only one of a and b, and those
// whose values differ (same false), each once. Subtrees the two maps
// share are skipped: for a map made from the other by a few changes, the
// cost is that of the changes, not of the maps.
func DiffKeys[V any](a, b PortMap[V], same func(x, y V) bool) iter.Seq[ServicePortName] {
	return func(yield func(ServicePortName) bool) {
		diffNodes(a.root, b.root, 0, same, yield)
	}
}

func diffNodes[V any](a, b *pmNode[V], shift uint, same func(x, y V) bool, yield func(ServicePortName) bool) bool {
	switch {
	case a == b:
		return true
	case a == nil:
		return b.walk(func(k ServicePortName, _ V) bool { return yield(k) })
	case b == nil:
		return a.walk(func(k ServicePortName, _ V) bool { return yield(k) })
	case shift >= 64:
		return diffSlow(a, b, same, yield)
	}
	for all := a.bitmap | b.bitmap; all != 0; all &= all - 1 {
		bit := all & -all
		sa, sb := slotAt(a, bit), slotAt(b, bit)
		var ok bool
		switch {
		case sa.child != nil && sb.child != nil:
			ok = diffNodes(sa.child, sb.child, shift+pmBits, same, yield)
		case sa.leaf != nil && sb.leaf != nil && sa.leaf.key == sb.leaf.key:
			ok = sa.leaf == sb.leaf || same(sa.leaf.val, sb.leaf.val) || yield(sa.leaf.key)
		default:
			ok = diffSlow(sa.node(), sb.node(), same, yield)
		}
		if !ok {
			return false
		}
	}
	return true
}

// slotAt is n's slot for bit (empty if none).
func slotAt[V any](n *pmNode[V], bit uint64) pmSlot[V] {
	if n.bitmap&bit == 0 {
		return pmSlot[V]{}
	}
	return n.slots[bits.OnesCount64(n.bitmap&(bit-1))]
}

// node is the slot as a subtree (nil for an empty slot).
func (s pmSlot[V]) node() *pmNode[V] {
	if s.leaf != nil {
		return &pmNode[V]{slots: []pmSlot[V]{s}}
	}
	return s.child
}

// diffSlow compares two subtrees entry by entry (small ones: where the
// trees' shapes differ because their entries do).
func diffSlow[V any](a, b *pmNode[V], same func(x, y V) bool, yield func(ServicePortName) bool) bool {
	inA := map[ServicePortName]V{}
	a.walk(func(k ServicePortName, v V) bool { inA[k] = v; return true })
	ok := b.walk(func(k ServicePortName, v V) bool {
		av, had := inA[k]
		delete(inA, k)
		return had && same(av, v) || yield(k)
	})
	if !ok {
		return false
	}
	for k := range inA {
		if !yield(k) {
			return false
		}
	}
	return true
}

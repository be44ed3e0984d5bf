package ipvs

import "iter"

// packed is a packed Element: elemKey4 or elemKey.
type packed interface {
	comparable
	element() Element
}

// elemTable is what the Syncer knows of the elements of one packing:
// their state, and those to look at in the next diff.
type elemTable[K packed] struct {
	state map[K]elemState
	dirty map[K]struct{}
}

func newElemTable[K packed]() elemTable[K] {
	return elemTable[K]{state: map[K]elemState{}, dirty: map[K]struct{}{}}
}

// set changes k's state, forgetting an element nobody wants or holds.
func (t *elemTable[K]) set(k K, change func(*elemState)) {
	st := t.state[k]
	change(&st)
	if st.refs <= 0 && !st.have {
		delete(t.state, k)
		return
	}
	t.state[k] = st
}

// own adds n owners (n < 0: removes) to each of keys, marking them dirty unless all are.
func (t *elemTable[K]) own(keys []K, n int32, allDirty bool) {
	for _, k := range keys {
		t.set(k, func(st *elemState) { st.refs += n })
		if !allDirty {
			t.dirty[k] = struct{}{}
		}
	}
}

// applied records k as held (or not) and no longer dirty.
func (t *elemTable[K]) applied(k K, held bool) {
	t.set(k, func(st *elemState) { st.have = held })
	delete(t.dirty, k)
}

// unhold forgets what the helper held, before a read of it.
func (t *elemTable[K]) unhold() {
	for k, st := range t.state {
		if st.refs <= 0 {
			delete(t.state, k)
			continue
		}
		t.state[k] = elemState{refs: st.refs}
	}
}

// diff adds the changes of the dirty elements (all of them: every one).
func (t *elemTable[K]) diff(c *HelperChange, all bool) {
	if all {
		for k, st := range t.state {
			diffElem(c, k, st)
		}
		return
	}
	for k := range t.dirty {
		if diffElem(c, k, t.state[k]) {
			delete(t.dirty, k)
		}
	}
}

// held yields the elements the helper holds.
func (t *elemTable[K]) held(yield func(Element) bool) bool {
	for k, st := range t.state {
		if st.have && !yield(k.element()) {
			return false
		}
	}
	return true
}

// shrink replaces an emptied dirty map: it keeps the room of its largest
// size otherwise.
func (t *elemTable[K]) shrink() {
	if len(t.dirty) == 0 {
		t.dirty = map[K]struct{}{}
	}
}

// elemSet is the Syncer's elements: the IPv4 ones packed small.
type elemSet struct {
	v4    elemTable[elemKey4]
	other elemTable[elemKey]
	// allDirty stands for every element being dirty (the first sync, a
	// read of the helper): a hundred thousand keys that the dirty maps
	// need not hold.
	allDirty bool
}

func newElemSet() elemSet {
	return elemSet{v4: newElemTable[elemKey4](), other: newElemTable[elemKey]()}
}

func (s *elemSet) len() int { return len(s.v4.state) + len(s.other.state) }

// own adds n owners (n < 0: removes) to a fragment's elements.
func (s *elemSet) own(p packedElems, n int32) {
	s.v4.own(p.v4, n, s.allDirty)
	s.other.own(p.other, n, s.allDirty)
}

// applied records e as held (or not) and no longer dirty.
func (s *elemSet) applied(e Element, held bool) {
	if k, ok := e.key4(); ok {
		s.v4.applied(k, held)
	} else {
		s.other.applied(e.key(), held)
	}
}

// readBack takes elems as what the helper holds; every element is dirty.
func (s *elemSet) readBack(elems []Element) {
	s.v4.unhold()
	s.other.unhold()
	for _, e := range elems {
		if k, ok := e.key4(); ok {
			s.v4.set(k, func(st *elemState) { st.have = true })
		} else {
			s.other.set(e.key(), func(st *elemState) { st.have = true })
		}
	}
	s.allDirty = true
}

// diff adds the changes of the dirty elements.
func (s *elemSet) diff(c *HelperChange) {
	if s.allDirty {
		// Most are additions (a first sync): made once at their size.
		c.AddElems = make([]Element, 0, s.len())
	}
	s.v4.diff(c, s.allDirty)
	s.other.diff(c, s.allDirty)
}

// lookedAt ends "every element is dirty" once the helper has what the
// diff of all of them asked for.
func (s *elemSet) lookedAt() {
	if s.allDirty {
		s.allDirty = false
		clear(s.v4.dirty)
		clear(s.other.dirty)
	}
}

// held yields the elements the helper holds, in no order.
func (s *elemSet) held() iter.Seq[Element] {
	return func(yield func(Element) bool) {
		if s.v4.held(yield) {
			s.other.held(yield)
		}
	}
}

func (s *elemSet) shrink() {
	s.v4.shrink()
	s.other.shrink()
}

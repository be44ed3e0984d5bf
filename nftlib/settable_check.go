package nftlib

import "bytes"

// SetTableDrift describes every difference between want, its elements
// included, and what the kernel holds of its table: the table's flags and
// comment, each set's type and comment, each chain's attributes, every
// rule (compared in canonical form, as the main tables' drift check does)
// and every element of the sets whose type is right. Nil means they match.
// A large difference is summarised (a flushed set lists a few of its
// elements and counts the rest).
func (k *Kernel) SetTableDrift(want *SetTable) ([]string, error) {
	f := want.Family
	chains := make(map[string]*Chain, len(want.Chains))
	names := make([]string, 0, len(want.Chains))
	for _, c := range want.Chains {
		chains[c.Name] = c
		names = append(names, c.Name)
	}
	kts, err := k.ReadFamily(f, []string{want.Name}, map[string][]string{want.Name: names})
	if err != nil {
		return nil, err
	}
	kt := kts[want.Name]
	var d drift
	if !kt.Exists {
		d.add("table %s %s: missing", f, want.Name)
		return d.list(), nil
	}
	if kt.Flags != 0 {
		d.add("table %s %s: flags 0x%x, want 0", f, want.Name, kt.Flags)
	}
	if !bytes.Equal(kt.Udata, commentUdata(0, want.Comment)) {
		d.add("table %s %s: comment differs", f, want.Name)
	}
	for _, c := range want.Chains {
		kc := kt.Chains[c.Name]
		if kc == nil {
			d.add("chain %s: missing", c.Name)
		} else if why := chainMismatch(kc, c); why != "" {
			d.add("chain %s: %s", c.Name, why)
		}
	}
	for n := range kt.Chains {
		if chains[n] == nil {
			d.add("chain %s: not ours", n)
		}
	}
	if err := k.chainRulesDrift(f, want.Name, chains, kt, &d); err != nil {
		return nil, err
	}
	for n, ks := range kt.Sets {
		if want.set(n) == nil {
			foreignSet(n, ks, &d)
		}
	}
	statefulDrift(kt, &d)
	for _, s := range want.Sets {
		if why := setMismatch(f, kt.Sets[s.Name], s); why != "" {
			d.add("set %s: %s", s.Name, why)
			continue
		}
		if err := k.setElementsDrift(want, s, &d); err != nil {
			return nil, err
		}
	}
	return d.list(), nil
}

// setElementsDrift compares the elements of one set with want's.
func (k *Kernel) setElementsDrift(want *SetTable, s *Set, d *drift) error {
	f := want.Family
	key := func(e SetElement) string {
		if s.Interval {
			return string(s.key(f, e, false)) + string(s.key(f, e, true))
		}
		return string(s.key(f, e, false))
	}
	missing := make(map[string]SetElement, len(want.Elements[s.Name]))
	for _, e := range want.Elements[s.Name] {
		missing[key(e)] = e
	}
	got, err := k.readSetElements(f, want.Name, s)
	if err != nil {
		return err
	}
	for _, e := range got {
		if _, ok := missing[key(e)]; !ok {
			d.add("set %s: element %s is not ours", s.Name, s.elementText(e))
			continue
		}
		delete(missing, key(e))
	}
	for _, e := range missing {
		d.add("set %s: element %s missing", s.Name, s.elementText(e))
	}
	return nil
}

package nftlib

import (
	"github.com/google/nftables/expr"
)

// SetMatch is `ip daddr @SET`: the address is in a named set of the table.
type SetMatch struct {
	Field Field
	Set   string
}

func (m SetMatch) text(f Family) string { return m.Field.text(f) + " @" + m.Set }

func (m SetMatch) exprs(f Family) []expr.Any {
	return []expr.Any{m.Field.load(f, 1), &expr.Lookup{SourceRegister: 1, SetName: m.Set}}
}

// decode: one field loaded and looked up (a SetLookup of one field
// without a protocol writes the same).
func (SetMatch) decode(f Family, ex []expr.Any) (Term, int, error) {
	if len(ex) == 0 {
		return nil, 0, nil
	}
	fl, ok := fieldLoad(f, ex[0])
	if !ok {
		return nil, 0, nil
	}
	l, ok := exprAt[*expr.Lookup](ex, 1)
	if !ok || l.IsDestRegSet || l.Invert {
		return nil, 0, nil
	}
	return SetMatch{Field: fl, Set: l.SetName}, 2, nil
}

func (m SetMatch) eval(s *state, t *Table, _ int) []result {
	in, err := s.inMap(t, m.Set, []Field{m.Field})
	if err != nil {
		return s.fail(err)
	}
	return s.matchIf(in)
}

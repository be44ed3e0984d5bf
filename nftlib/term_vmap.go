package nftlib

import (
	"github.com/google/nftables/expr"
)

// vmapLookup is `<key fields> vmap @map`: the map's verdict for the packet's key.
type vmapLookup struct {
	Key [4]Field // up to 4 fields, N used
	N   int
	Map string
}

// Vmap is the term `<key fields> vmap @m`: the verdict map m's verdict
// for the packet's key.
func Vmap(m string, key ...Field) Term {
	v := vmapLookup{Map: m, N: len(key)}
	copy(v.Key[:], key)
	return v
}

func (v vmapLookup) fields() []Field { return v.Key[:v.N] }

func (v vmapLookup) text(f Family) string {
	s := ""
	for i, fl := range v.fields() {
		if i > 0 {
			s += " . "
		}
		s += fl.text(f)
	}
	return s + " vmap @" + v.Map
}

func (v vmapLookup) exprs(f Family) []expr.Any {
	out := keyLoads(nil, f, v.fields())
	return append(out, &expr.Lookup{SourceRegister: 1, SetName: v.Map, IsDestRegSet: true, DestRegister: 0})
}

// decode: the key's loads, a lookup into the verdict register.
func (vmapLookup) decode(f Family, ex []expr.Any) (Term, int, error) {
	key := fieldLoads(f, ex)
	l, ok := exprAt[*expr.Lookup](ex, len(key))
	if !ok || !l.IsDestRegSet || l.Invert || len(key) == 0 || len(key) > len(vmapLookup{}.Key) {
		return nil, 0, nil
	}
	return Vmap(l.SetName, key...), len(key) + 1, nil
}

// eval follows the verdict of the map's element for the packet's key, if
// there is one.
func (v vmapLookup) eval(s *state, t *Table, depth int) []result {
	for _, e := range t.Elements(v.Map) {
		if s.pkt.keyMatches(v.fields(), e.Key) {
			return s.verdict(t, e.Verdict, depth)
		}
	}
	return s.matchIf(false)
}

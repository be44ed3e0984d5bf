package nftlib

import (
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// SetLookup is `ip daddr . meta l4proto . th dport @SET`: the packet's key
// is in a named set of the table. With Proto, a `meta l4proto` match comes
// first and nft names the port after the protocol (`tcp dport @SET`,
// `ip daddr . sctp dport @SET`).
type SetLookup struct {
	Key   [4]Field
	N     int
	Set   string
	Proto uint8
}

// LookupSet builds a SetLookup over the given key fields.
func LookupSet(set string, key ...Field) SetLookup {
	l := SetLookup{Set: set, N: len(key)}
	copy(l.Key[:], key)
	return l
}

// WithProto returns the lookup after a `meta l4proto P` match.
func (l SetLookup) WithProto(p uint8) SetLookup { l.Proto = p; return l }

func (l SetLookup) fields() []Field { return l.Key[:l.N] }

func (l SetLookup) text(f Family) string {
	parts := make([]string, l.N)
	for i, fl := range l.fields() {
		parts[i] = fl.text(f)
		if fl == FieldDport && l.Proto != 0 {
			parts[i] = ProtoName(l.Proto) + " dport"
		}
	}
	return strings.Join(parts, " . ") + " @" + l.Set
}

func (l SetLookup) exprs(f Family) []expr.Any {
	var out []expr.Any
	if l.Proto != 0 {
		out = append(out, ProtoMatch{Proto: l.Proto}.exprs(f)...)
	}
	out = keyLoads(out, f, l.fields())
	return append(out, &expr.Lookup{SourceRegister: unix.NFT_REG_1, SetName: l.Set})
}

// decode: the protocol match nft merges into `tcp dport`, the key's loads,
// the lookup. One field without a protocol is left to SetMatch, and a
// protocol match before a key without a port is a ProtoMatch of its own.
func (SetLookup) decode(f Family, ex []expr.Any) (Term, int, error) {
	proto, withProto := protoMatchAt(f, ex)
	i := 0
	if withProto {
		i = 2
	}
	key := fieldLoads(f, ex[i:])
	l, ok := exprAt[*expr.Lookup](ex, i+len(key))
	switch {
	case !ok || l.IsDestRegSet || l.Invert || len(key) == 0 || len(key) > len(SetLookup{}.Key):
		return nil, 0, nil
	case withProto && !slices.Contains(key, FieldDport), !withProto && len(key) == 1:
		return nil, 0, nil
	}
	return LookupSet(l.SetName, key...).WithProto(proto), i + len(key) + 1, nil
}

func (l SetLookup) eval(s *state, t *Table, _ int) []result {
	if l.Proto != 0 && s.pkt.Proto != l.Proto {
		return s.matchIf(false)
	}
	in, err := s.inMap(t, l.Set, l.fields())
	if err != nil {
		return s.fail(err)
	}
	return s.matchIf(in)
}

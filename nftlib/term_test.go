package nftlib

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// termCase is one term of one kind, with what a Trace makes of it.
type termCase struct {
	term Term
	// decodesAs is what the term reads back as when that is another
	// term writing the same expressions; nil for the term itself.
	decodesAs Term
	pkt       func(p *Packet) // changes the traced packet, if set
	// want are the Trace outcomes (without the path) of a rule of the
	// term followed by `masquerade`; wantErr is a part of Trace's error.
	want    []string
	wantErr string
}

// traceFixture is what the traced rule can reach: the addresses of the
// packet, a chain to jump to and two maps.
type traceFixture struct {
	client, service, node, endpoint netip.Addr
	oddBits                         int // a prefix length that is not whole bytes and tells node from service
}

func fixture(f Family) traceFixture {
	if f == IPv6 {
		return traceFixture{mustAddr("fd00::2"), mustAddr("fd00:96::1"), mustAddr("fd00:99::1"), mustAddr("fd00:244::5"), 36}
	}
	return traceFixture{mustAddr("10.0.0.2"), mustAddr("10.96.0.1"), mustAddr("10.99.0.1"), mustAddr("10.244.0.5"), 20}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// termCases are the examples of every kind, by kind (its type name).
func termCases(f Family) map[string][]termCase {
	x := fixture(f)
	const (
		match   = "1.000 no dnat masquerade"
		noMatch = "1.000 no dnat"
	)
	prefix := func(a netip.Addr, bits int) netip.Prefix { return netip.PrefixFrom(a, bits).Masked() }
	toNode := func(p *Packet) { p.Dst = x.node }
	fromNode := func(p *Packet) { p.Src = x.node }
	dnat := fmt.Sprintf("1.000 dnat %s", netip.AddrPortFrom(x.endpoint, 8080))
	svcKey := []Field{FieldDaddr, FieldL4Proto, FieldDport}
	return map[string][]termCase{
		"AddrMatch": {
			{term: AddrMatch{Field: FieldDaddr, Prefix: netip.PrefixFrom(x.service, x.service.BitLen())}, want: []string{match}},
			{term: AddrMatch{Field: FieldSaddr, Negate: true, Prefix: prefix(x.client, 16)}, want: []string{noMatch}},
			{term: AddrMatch{Field: FieldSaddr, Prefix: prefix(x.client, 12)}, want: []string{match}},
			{term: AddrMatch{Field: FieldDaddr, Negate: true, Prefix: prefix(x.node, x.oddBits)}, want: []string{match}},
		},
		"ProtoMatch": {
			{term: ProtoMatch{Proto: unix.IPPROTO_TCP}, want: []string{match}},
			{term: ProtoMatch{Proto: unix.IPPROTO_SCTP}, want: []string{noMatch}},
		},
		"PortMatch": {
			{term: PortMatch{Port: 80}, want: []string{match}},
			{term: PortMatch{Port: 65535}, want: []string{noMatch}},
		},
		"FibLocal": {
			{term: FibLocal{}, want: []string{noMatch}},
			{term: FibLocal{}, pkt: toNode, want: []string{match}},
			{term: FibLocal{Saddr: true}, pkt: fromNode, want: []string{match}},
		},
		"CtState": {
			{term: CtState{Bits: CtNew | CtEstablished}, want: []string{match}},
			{term: CtState{Bits: CtInvalid}, want: []string{noMatch}},
		},
		"CtStateNone": {
			{term: CtStateNone{Bits: CtEstablished | CtRelated}, want: []string{match}},
			{term: CtStateNone{Bits: CtNew}, want: []string{noMatch}},
		},
		"CtStatusNone": {
			{term: CtStatusNone{Bits: CtStatusDNAT}, want: []string{match}},
		},
		"IfName": {
			{term: IfName{Name: "eth0"}, want: []string{match}},
			{term: IfName{Name: "eth", Prefix: true, Negate: true}, want: []string{noMatch}},
			{term: IfName{Name: "cni0", Negate: true}, want: []string{match}},
		},
		"MarkIsSet": {{term: MarkIsSet{Bit: 0x4000}, want: []string{noMatch}}},
		"MarkZero":  {{term: MarkZero{Bit: 0x4000}, want: []string{match}}},
		"MarkSet": {
			{term: MarkSet{Bit: 0x4000}, want: []string{match}},
			{term: MarkSet{Bit: 0x4000, Toggle: true}, want: []string{match}},
		},
		"SetMatch": {
			{term: SetMatch{Field: FieldSaddr, Set: "clients"}, want: []string{match}},
			{term: SetMatch{Field: FieldDaddr, Set: "clients"}, want: []string{noMatch}},
			{term: SetMatch{Field: FieldDaddr, Set: "nosuch"}, wantErr: "lookup in nosuch, which is not a map of the table"},
		},
		"SetLookup": {
			{term: LookupSet("svc", svcKey...), want: []string{match}},
			{term: LookupSet("ports", FieldDaddr, FieldDport).WithProto(unix.IPPROTO_TCP), want: []string{match}},
			{term: LookupSet("svc", FieldDport).WithProto(unix.IPPROTO_UDP), want: []string{noMatch}},
			{term: LookupSet("clients", FieldSaddr), decodesAs: SetMatch{Field: FieldSaddr, Set: "clients"}, want: []string{match}},
		},
		"vmapLookup": {
			{term: Vmap("svc", svcKey...), want: []string{dnat + " masquerade"}},
			{term: Vmap("clients", FieldSaddr), want: []string{noMatch}}, // accept
			{term: Vmap("clients", FieldDaddr), want: []string{noMatch}}, // no element: the rule ends
		},
		"NumgenZero": {
			{term: NumgenZero{Mod: 2}, want: []string{"0.500 no dnat masquerade", "0.500 no dnat"}},
			{term: NumgenZero{Mod: 1000}, want: []string{"0.001 no dnat masquerade", "0.999 no dnat"}},
		},
		"StickyMatch": {
			{term: StickyMatch{Set: "sticky", ID: 7}, want: []string{match}},
			{term: StickyMatch{Set: "sticky", ID: 8}, want: []string{noMatch}},
		},
		"StickyUpdate": {{term: StickyUpdate{Set: "sticky", ID: 9, Timeout: 3 * time.Hour}, want: []string{match + " sticky 9"}}},
		"DNAT":         {{term: DNAT{Addr: x.endpoint, Port: 8080}, want: []string{dnat + " masquerade"}}},
		"Masquerade":   {{term: Masquerade{}, want: []string{match}}},
		"Reject":       {{term: Reject{}, want: []string{"1.000 reject"}}},
		"Verdict": {
			{term: Verdict{Kind: Accept}, want: []string{noMatch}},
			{term: Verdict{Kind: Drop}, want: []string{"1.000 drop"}},
			{term: Verdict{Kind: Return}, want: []string{noMatch}},
			{term: JumpTo("target"), want: []string{dnat + " masquerade"}},
			{term: GotoChain("target"), want: []string{dnat}},
			{term: JumpTo("nosuch"), want: []string{"1.000 drop"}},
		},
	}
}

// traceTable is a table whose entry chain (nat prerouting) runs the term,
// then masquerades.
func traceTable(f Family, term Term) *Table {
	x := fixture(f)
	return &Table{Family: f, Name: "t", Sticky: "sticky", StickyComment: "source . target id",
		Chains: []*Chain{
			{Name: "entry", Hook: &Hook{Type: "nat", Hook: "prerouting", Priority: -100}, Rules: []Rule{R(term, Masquerade{})}},
			{Name: "target", Rules: []Rule{R(DNAT{Addr: x.endpoint, Port: 8080})}},
		},
		Maps: []*Map{
			{Name: "svc", Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}, Elements: []Element{
				{Key: Key{Addr: x.service, Proto: unix.IPPROTO_TCP, Port: 80}, Verdict: JumpTo("target")},
			}},
			{Name: "clients", Key: []Field{FieldSaddr}, Elements: []Element{{Key: Key{Addr: x.client}, Verdict: Verdict{Kind: Accept}}}},
			{Name: "ports", Key: []Field{FieldDaddr, FieldDport}, Elements: []Element{{Key: Key{Addr: x.service, Port: 80}, Verdict: Verdict{Kind: Accept}}}},
		},
	}
}

// Every kind of term goes through all it knows: its text, its encoding
// (the expressions, and the direct one where it has one), the decoding of
// that encoding back into the term (whose text is the same), and a trace.
// A kind without examples here fails.
func TestEveryTermKind(t *testing.T) {
	for _, f := range Families {
		cases := termCases(f)
		for _, kind := range termKinds {
			name := reflect.TypeOf(kind).Name()
			if len(cases[name]) == 0 {
				t.Errorf("term kind %s has no examples in termCases", name)
			}
			for i, tc := range cases[name] {
				if reflect.TypeOf(tc.term) != reflect.TypeOf(kind) {
					t.Errorf("%s example %d is a %T", name, i, tc.term)
				}
				t.Run(fmt.Sprintf("%s/%s/%d", f, name, i), func(t *testing.T) {
					checkRoundTrip(t, f, tc)
					checkTrace(t, f, tc)
				})
			}
		}
	}
}

func checkRoundTrip(t *testing.T, f Family, tc termCase) {
	text := tc.term.text(f)
	if text == "" || strings.Contains(text, "?") {
		t.Errorf("text %q", text)
	}
	viaExprs := &batch{}
	for _, e := range tc.term.exprs(f) {
		viaExprs.expr(f, e)
	}
	if d, ok := tc.term.(directTerm); ok {
		direct := &batch{}
		if d.direct(direct, f) && !bytes.Equal(direct.Buf, viaExprs.Buf) {
			t.Errorf("%s: direct encoding %x, expressions %x", text, direct.Buf, viaExprs.Buf)
		}
	}
	got, err := decodeRule(f, viaExprs.Buf)
	if err != nil {
		t.Fatalf("%s: decoding: %v", text, err)
	}
	want := tc.term
	if tc.decodesAs != nil {
		want = tc.decodesAs
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("%s decodes as %#v, want %#v", text, got, want)
	}
	if back := R(got...).Text(f); back != text {
		t.Errorf("%q decodes as %q", text, back)
	}
}

func checkTrace(t *testing.T, f Family, tc termCase) {
	x := fixture(f)
	p := Packet{Src: x.client, Dst: x.service, Proto: unix.IPPROTO_TCP, Dport: 80, Local: []netip.Addr{x.node}, Iif: "eth0", Sticky: []uint32{7}}
	if tc.pkt != nil {
		tc.pkt(&p)
	}
	rs := &Ruleset{Tables: []*Table{traceTable(f, tc.term)}}
	out, err := rs.Trace(p)
	if tc.wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: trace error %v, want %q", tc.term.text(f), err, tc.wantErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", tc.term.text(f), err)
	}
	var got []string
	for _, o := range out {
		s, _, _ := strings.Cut(o.String(), " via ")
		if o.Sticky != 0 {
			s += fmt.Sprintf(" sticky %d", o.Sticky)
		}
		got = append(got, s)
	}
	if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
		t.Errorf("%s: trace\n%s\nwant\n%s", tc.term.text(f), strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
	}
}

// termKinds holds every type of the package that is a Term (has an eval
// method), once: a kind left out would not be decoded.
func TestTermKindsComplete(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Skip("the package's source is not here (the VM tier runs the test binary alone)")
	}
	var evaluated []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "eval" {
				continue
			}
			if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok {
				evaluated = append(evaluated, id.Name)
			}
		}
	}
	var registered []string
	for _, kind := range termKinds {
		registered = append(registered, reflect.TypeOf(kind).Name())
	}
	sort.Strings(evaluated)
	sort.Strings(registered)
	if strings.Join(evaluated, " ") != strings.Join(registered, " ") {
		t.Errorf("types with an eval method:\n %s\ntermKinds:\n %s", strings.Join(evaluated, " "), strings.Join(registered, " "))
	}
}

// Expressions no term of ours writes are an error naming them, never a
// term that means something else, nor a panic.
func TestDecodeRefusesForeignExpressions(t *testing.T) {
	f := IPv4
	daddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	tests := []struct {
		name  string
		exprs []expr.Any
		want  string
	}{
		{"l4proto !=", []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{6}}}, "meta (key 16), cmp (op 1, 1 bytes)"},
		{"port <", []expr.Any{FieldDport.load(f, 1), &expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: []byte{0, 80}}}, "cmp (op 2"},
		{"fib daddr type != local", []expr.Any{
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(unix.RTN_LOCAL)},
		}, "fib, cmp"},
		{"ct status", []expr.Any{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(8), Xor: le32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: le32(0)},
		}, "ct, bitwise"},
		{"vmap of five fields", []expr.Any{daddr, daddr, daddr, daddr, daddr, &expr.Lookup{SourceRegister: 1, SetName: "m", IsDestRegSet: true}}, "payload"},
		{"daddr != @set", []expr.Any{daddr, &expr.Lookup{SourceRegister: 1, SetName: "s", Invert: true}}, "lookup @s"},
		{"masquerade random", []expr.Any{&expr.Masq{Random: true}}, "masq"},
		{"load without comparison", []expr.Any{daddr}, "payload (base 1 offset 16 length 4): not a term we write"},
		{"a verdict after a foreign match", []expr.Any{&expr.Meta{Key: expr.MetaKeyOIF, Register: 1}, &expr.Verdict{Kind: expr.VerdictAccept}}, "meta (key 5)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &batch{}
			for _, e := range tt.exprs {
				b.expr(f, e)
			}
			terms, err := decodeRule(f, b.Buf)
			if err == nil {
				t.Fatalf("decoded as %q", R(terms...).Text(f))
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
}

package nftlib

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/parallel"
)

// The direct encoder writes exactly what google/nftables writes for every
// expression of every term kind's examples.
func TestDirectEncodingMatchesLibrary(t *testing.T) {
	seen := 0
	for _, f := range Families {
		for _, cases := range termCases(f) {
			for _, tc := range cases {
				for _, e := range tc.term.exprs(f) {
					direct := &batch{}
					direct.expr(f, e)
					data, err := expr.Marshal(byte(f), e)
					if err != nil {
						t.Fatal(err)
					}
					lib := &batch{}
					lib.attr(unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED, data)
					if !bytes.Equal(direct.Buf, lib.Buf) {
						t.Errorf("%s %T %+v:\n direct %x\n library %x", f, e, e, direct.Buf, lib.Buf)
					}
					seen++
				}
			}
		}
	}
	if seen < 50 {
		t.Fatalf("only %d expressions checked", seen)
	}
}

// A transaction encoded on several CPUs is byte for byte the one encoded
// on one, with each message's sequence number and description in place,
// whether the rules end the batch or elements follow them.
func TestParallelEncodingMatchesSerial(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	tbl := releaseTable(3 * ParallelMin)
	chains := tbl.AllChains()
	if parts := parallel.Parts(len(chains), ParallelMin); parts < 3 {
		t.Fatalf("%d chains make %d parts, want 3", len(chains), parts)
	}
	for _, tail := range []bool{false, true} {
		encode := func(parallel bool) ([]byte, *batch) {
			b := newBatch(7)
			if parallel {
				b.AddChains(IPv4, tbl.Name, chains)
				b.addChainRules(IPv4, tbl.Name, chains)
			} else {
				for _, c := range chains {
					b.AddChain(IPv4, tbl.Name, c)
				}
				for _, c := range chains {
					for _, r := range c.Rules {
						b.AddRule(IPv4, tbl.Name, c.Name, r)
					}
				}
			}
			if tail {
				m := tbl.Map("m")
				b.Elements(true, IPv4, tbl.Name, m, tbl.Elements(m.Name))
			}
			chunks, _, err := b.finish()
			if err != nil {
				t.Fatal(err)
			}
			return bytes.Join(chunks, nil), b
		}
		serial, sb := encode(false)
		par, pb := encode(true)
		if !bytes.Equal(serial, par) {
			t.Fatalf("elements after the rules=%v: the parallel encoding differs (%d bytes, serial %d)", tail, len(par), len(serial))
		}
		const seq = 7 + 12000
		if sb.Messages() != pb.Messages() || sb.describe(seq) != pb.describe(seq) {
			t.Errorf("message %d: %q, serial %q", seq, pb.describe(seq), sb.describe(seq))
		}
	}
}

// A refused message is named by what its encoding says it does.
func TestDescribeMessage(t *testing.T) {
	m := &Map{Name: "service-ips", Key: []Field{FieldDaddr, FieldL4Proto, FieldDport}}
	elems := []Element{{Key: Key{Addr: mustAddr("10.0.0.1"), Proto: 6, Port: 80}}}
	b := newBatch(100)
	steps := []struct {
		write func()
		want  string
	}{
		{func() { b.AddTable(IPv4, "t", "c") }, "add table t"},
		{func() { b.addMap(IPv4, "t", m, 1) }, "add map service-ips"},
		{func() { b.addStickySet(IPv4, "t", "sticky", "source . target id", 2) }, "add set sticky"},
		{func() { b.AddChain(IPv4, "t", &Chain{Name: "KUBE-SVC-X"}) }, "add chain KUBE-SVC-X"},
		{func() { b.AddRule(IPv4, "t", "KUBE-SVC-X", R(Verdict{Kind: Drop})) }, "add rule to KUBE-SVC-X"},
		{func() { b.FlushChain(IPv4, "t", "KUBE-SVC-X") }, "flush chain KUBE-SVC-X"},
		{func() { b.flushMap(IPv4, "t", m) }, "flush map service-ips"},
		{func() { b.Elements(true, IPv4, "t", m, elems) }, "add elements to service-ips"},
		{func() { b.Elements(false, IPv4, "t", m, elems) }, "delete elements from service-ips"},
		{func() { b.DelChain(IPv4, "t", "KUBE-SVC-X") }, "delete chain KUBE-SVC-X"},
		{func() { b.delSet(IPv4, "t", "service-ips") }, "delete set service-ips"},
		{func() { b.DelTable(IPv4, "t") }, "delete table t"},
	}
	for i, s := range steps {
		s.write()
		if got := b.describe(uint32(101 + i)); got != s.want {
			t.Errorf("message %d: %q, want %q", 101+i, got, s.want)
		}
	}
	if _, _, err := b.finish(); err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint32]string{100: "batch begin", 101 + uint32(len(steps)): "batch end", 3: "message 3"} {
		if got := b.describe(seq); got != want {
			t.Errorf("message %d: %q, want %q", seq, got, want)
		}
	}
}

package nftlib

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// BenchmarkKernelCommitByLayout asks whether a layout of the same Services
// commits faster, first and afterwards, at the shape of upstream's report
// #135639: 5,000 Services x 50 endpoints, one table as the proxy writes it.
// The layouts:
//
//	sep-chains    ours and iptables mode's: a KUBE-SVC chain of 50 numgen
//	              rules, each a goto to a KUBE-SEP chain of two rules (the
//	              hairpin's jump to KUBE-MARK-MASQ, the dnat)
//	sep-dnat-only the same chains, each KUBE-SEP chain its dnat alone
//	              (250,000 rules fewer): what the rules cost
//	no-sep-chains the KUBE-SVC chain's rules dnat themselves (250,000
//	              chains fewer): what the chains cost; not iptables mode's
//	              topology, whose names the migration tools compare
//
// Reported: first (the commit creating the whole table, ms) and floor (the
// median commit of adding or deleting one empty chain afterwards, ms).
// Smaller shapes: -bench 'Layout/services=500/'.
func BenchmarkKernelCommitByLayout(b *testing.B) {
	for _, services := range []int{500, 5000} {
		for _, layout := range []string{"sep-chains", "sep-dnat-only", "no-sep-chains"} {
			b.Run(fmt.Sprintf("services=%d/%s", services, layout), func(b *testing.B) {
				benchCommitLayout(b, layoutTable(layout, services, 50))
			})
		}
	}
}

func benchCommitLayout(b *testing.B, t *Table) {
	ns := testns.New(b, "knp-nftlib-")
	k := openTestKernel(b, ns)
	x, _ := FullTx(t, &KernelTable{}, false)
	tx := k.NewTx()
	var setID uint32
	x.Write(tx, &setID)
	start := time.Now()
	if err := k.CommitTx(tx); err != nil {
		b.Fatal(err)
	}
	first := time.Since(start)
	var took []time.Duration
	add := true
	for b.Loop() {
		tx := k.NewTx()
		if add {
			tx.AddChains(t.Family, t.Name, []*Chain{{Name: "floor"}})
		} else {
			tx.DelChain(t.Family, t.Name, "floor")
		}
		add = !add
		start := time.Now()
		if err := k.CommitTx(tx); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	b.ReportMetric(float64(first.Microseconds())/1000, "first-ms")
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "floor-ms")
	chains, rules := 0, 0
	for _, f := range t.Fragments {
		chains += len(f.Chains)
		for _, c := range f.Chains {
			rules += len(c.Rules)
		}
	}
	b.ReportMetric(float64(chains), "chains")
	b.ReportMetric(float64(rules), "rules")
}

// layoutTable is services Services x perService endpoints in layout (see
// BenchmarkKernelCommitByLayout), each Service a fragment reached from
// KUBE-SERVICES' verdict map, as the proxy's table is.
func layoutTable(layout string, services, perService int) *Table {
	t := &Table{Family: IPv4, Name: "t", Fragments: map[string]*Fragment{},
		Maps: []*Map{{Name: "service-ips", Key: []Field{FieldDaddr}}},
		Chains: []*Chain{
			{Name: "nat-prerouting", Hook: &Hook{Type: "nat", Hook: "prerouting", Priority: -100}, Rules: []Rule{R(JumpTo("KUBE-SERVICES"))}},
			{Name: "KUBE-SERVICES", Rules: []Rule{R(Vmap("service-ips", FieldDaddr))}},
			{Name: "KUBE-MARK-MASQ", Rules: []Rule{R(MarkSet{Bit: 0x4000})}},
		}}
	for s := range services {
		svc := fmt.Sprintf("KUBE-SVC-%05d", s)
		vip := netip.AddrFrom4([4]byte{10, 96, byte(s >> 8), byte(s)})
		f := &Fragment{Elements: []MapElement{{Map: "service-ips",
			Element: Element{Key: Key{Addr: vip}, Verdict: GotoChain(svc), Comment: "ns/s:p"}}}}
		var pick []Rule
		for e := range perService {
			ep := netip.AddrFrom4([4]byte{10, byte(128 + s>>8), byte(s), byte(e + 1)})
			var terms []Term
			if left := perService - e; left > 1 {
				terms = append(terms, NumgenZero{Mod: uint32(left)})
			}
			sep := fmt.Sprintf("KUBE-SEP-%05d-%02d", s, e)
			switch layout {
			case "no-sep-chains":
				pick = append(pick, R(append(terms, DNAT{Addr: ep, Port: 8080})...))
				continue
			case "sep-dnat-only":
				f.Chains = append(f.Chains, &Chain{Name: sep, Comment: "ns/s:p", Rules: []Rule{R(DNAT{Addr: ep, Port: 8080})}})
			default:
				f.Chains = append(f.Chains, &Chain{Name: sep, Comment: "ns/s:p", Rules: []Rule{
					R(AddrMatch{Field: FieldSaddr, Prefix: netip.PrefixFrom(ep, 32)}, JumpTo("KUBE-MARK-MASQ")),
					R(DNAT{Addr: ep, Port: 8080}),
				}})
			}
			pick = append(pick, R(append(terms, GotoChain(sep))...))
		}
		f.Chains = append([]*Chain{{Name: svc, Comment: "ns/s:p", Rules: pick}}, f.Chains...)
		t.Fragments[svc] = f
	}
	return t
}

package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// BenchmarkKernelTxShapes takes apart what a small transaction costs while
// n Services x 10 endpoints are programmed (issue 12: on kernel 6.1 a
// one-endpoint change grows with the table, on 6.18 it does not). Each
// variant is one kind of transaction, timed as Apply (what Sync reports as
// res.Kernel), median over the iterations:
//
//	floor           add or delete one empty chain in the delta table
//	delta-plain     flush a chain of the delta table, add a rule without a
//	                verdict (payload + cmp: no expression the kernel validates)
//	delta-accept    the same with "accept" (an immediate: marks validation)
//	delta-jump      the same with "jump" to an empty chain of the delta table
//	tiny-jump       the same in a fourth table with three chains and no
//	                base chain
//	main-jump       the same in the main table
//	delta-elem      add or delete one service-ips element of the delta
//	                table, "goto" an empty chain of the delta table
//	main-elem       the same in the main table
//	main-elem-del   delete one main service-ips element (the add, untimed,
//	                comes before)
//	change          a one-endpoint change through Sync (warm)
//
// Kernel median ms, Debian 12's 6.1.0-56 in the TCG VM (hack/vm) / this
// machine's 6.18, Services x 10 endpoints:
//
//	variant        10          1k            5k            10k
//	floor          0.33/0.015  0.62/0.11     4.0/1.0       7.9/2.2
//	delta-plain    0.24/0.027  0.75/0.12     3.6/1.0       8.6/2.1
//	delta-accept   0.34/0.018  21/0.12       123/1.1       224/2.2
//	delta-jump     0.32/0.016  20/0.15       129/1.0       223/2.2
//	tiny-jump      0.47/0.010  20/0.12       124/1.1       219/2.2
//	main-jump      0.54/0.046  20/7.1        121/53        225/137
//	delta-elem     0.28/0.013  19/0.12       118/1.2       217/2.1
//	main-elem      0.28/0.043  19/6.7        123/41        224/126
//	main-elem-del  0.09/0.008  1.2/0.21      3.2/1.0       8.0/2.3
//	change         1.0/0.080   19/0.27       123/1.2       230/2.6
//
// On 6.1 every variant that adds an expression with a validate hook or a
// jump/goto element costs the same as main-jump, in whichever table, even
// one without base chains (tiny-jump): 6.1 keeps one validation state per
// network namespace and validates every table when it is set (see
// deltaSuffix). 6.18 keeps it per table, so only main-* walk the main
// table. The floor (the commit's walk over every chain) grows on both.
//
// Pick a size with -bench 'TxShapes/services=1000/': the setup (a full
// sync) runs only for the sizes selected.
func BenchmarkKernelTxShapes(b *testing.B) {
	for _, n := range []int{10, 1000, 5000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchTxShapes(b, n) })
	}
}

func benchTxShapes(b *testing.B, n int) {
	ns := testns.New(b, "knp-nft-")
	be := openTestBackend(b, ns, demoConfig())
	st := scaleState(n, 10)
	if _, err := be.Sync(context.Background(), st); err != nil {
		b.Fatal(err)
	}
	gen := 1
	// svc-7 moves to the delta table; later changes keep it there.
	if _, err := be.Sync(context.Background(), withOneEndpointChanged(st, gen)); err != nil {
		b.Fatal(err)
	}
	main, delta, tiny := DefaultTableName, DefaultTableName+deltaSuffix, "tiny"
	apply := func(bt nftlib.KernelTx) time.Duration {
		start := time.Now()
		err := be.kern().CommitTx(bt)
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		return took
	}
	// Scratch chains: "v" gets the rules, "t" is the jump target.
	bt := be.kern().NewTx()
	bt.AddTable(nftlib.IPv4, tiny, "")
	for _, table := range []string{main, delta, tiny} {
		bt.AddChains(nftlib.IPv4, table, []*nftlib.Chain{{Name: "v"}})
		bt.AddChains(nftlib.IPv4, table, []*nftlib.Chain{{Name: "t"}})
	}
	bt.AddChains(nftlib.IPv4, tiny, []*nftlib.Chain{{Name: "u"}})
	apply(bt)

	mapOf := func(kind TableKind) *nftlib.Map {
		for _, m := range be.applied[tableID{nftlib.IPv4, kind}].Maps {
			if m.Name == mapServiceIPs {
				return m
			}
		}
		b.Fatal("no service-ips map")
		return nil
	}
	elem := nftlib.Element{Key: nftlib.Key{Addr: netip.MustParseAddr("10.255.0.1"), Proto: unix.IPPROTO_TCP, Port: 1}, Verdict: nftlib.GotoChain("t")}

	type variant struct {
		name string
		// tx fills the timed transaction; pre, when set, is applied
		// untimed before it.
		tx, pre func(bt nftlib.KernelTx)
	}
	rule := func(table string, terms ...nftlib.Term) func(nftlib.KernelTx) {
		return func(bt nftlib.KernelTx) {
			bt.FlushChain(nftlib.IPv4, table, "v")
			bt.AddRule(nftlib.IPv4, table, "v", nftlib.R(terms...))
		}
	}
	toggle := func(on func(nftlib.KernelTx), off func(nftlib.KernelTx)) func(nftlib.KernelTx) {
		state := false
		return func(bt nftlib.KernelTx) {
			state = !state
			if state {
				on(bt)
			} else {
				off(bt)
			}
		}
	}
	port := nftlib.PortMatch{Port: 1}
	variants := []variant{
		{name: "floor", tx: toggle(
			func(bt nftlib.KernelTx) { bt.AddChains(nftlib.IPv4, delta, []*nftlib.Chain{{Name: "floor"}}) },
			func(bt nftlib.KernelTx) { bt.DelChain(nftlib.IPv4, delta, "floor") })},
		{name: "delta-plain", tx: rule(delta, port)},
		{name: "delta-accept", tx: rule(delta, port, nftlib.Verdict{Kind: nftlib.Accept})},
		{name: "delta-jump", tx: rule(delta, port, nftlib.JumpTo("t"))},
		{name: "tiny-jump", tx: rule(tiny, port, nftlib.JumpTo("t"))},
		{name: "main-jump", tx: rule(main, port, nftlib.JumpTo("t"))},
		{name: "delta-elem", tx: toggle(
			func(bt nftlib.KernelTx) {
				bt.Elements(true, nftlib.IPv4, delta, mapOf(DeltaTable), []nftlib.Element{elem})
			},
			func(bt nftlib.KernelTx) {
				bt.Elements(false, nftlib.IPv4, delta, mapOf(DeltaTable), []nftlib.Element{elem})
			})},
		{name: "main-elem", tx: toggle(
			func(bt nftlib.KernelTx) {
				bt.Elements(true, nftlib.IPv4, main, mapOf(MainTable), []nftlib.Element{elem})
			},
			func(bt nftlib.KernelTx) {
				bt.Elements(false, nftlib.IPv4, main, mapOf(MainTable), []nftlib.Element{elem})
			})},
		{name: "main-elem-del",
			pre: func(bt nftlib.KernelTx) {
				bt.Elements(true, nftlib.IPv4, main, mapOf(MainTable), []nftlib.Element{elem})
			},
			tx: func(bt nftlib.KernelTx) {
				bt.Elements(false, nftlib.IPv4, main, mapOf(MainTable), []nftlib.Element{elem})
			}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				if v.pre != nil {
					b.StopTimer()
					bt := be.kern().NewTx()
					v.pre(bt)
					apply(bt)
					b.StartTimer()
				}
				bt := be.kern().NewTx()
				v.tx(bt)
				took = append(took, apply(bt))
			}
			b.ReportMetric(median(took).Seconds()*1000, "kernel-median-ms")
		})
	}
	b.Run("change", func(b *testing.B) {
		var took []time.Duration
		advance := fakeClock(be) // changes 1s apart, as in the proxy
		for b.Loop() {
			gen++
			advance(staleChainAge)
			res, err := be.Sync(context.Background(), withOneEndpointChanged(st, gen))
			if err != nil {
				b.Fatal(err)
			}
			if res.Full {
				b.Fatal("full sync")
			}
			took = append(took, res.Kernel)
		}
		b.ReportMetric(median(took).Seconds()*1000, "kernel-median-ms")
	})
}

package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
// Pick a size with -bench 'TxShapes/services=1000/': the setup (a full
// sync) runs only for the sizes selected.
func BenchmarkKernelTxShapes(b *testing.B) {
	for _, n := range []int{10, 1000, 5000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) { benchTxShapes(b, n) })
	}
}

func benchTxShapes(b *testing.B, n int) {
	ns := testNetns(b)
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
	apply := func(bt *batch) time.Duration {
		start := time.Now()
		err := be.k.Apply(bt)
		took := time.Since(start)
		be.k.finished(bt)
		if err != nil {
			b.Fatal(err)
		}
		return took
	}
	// Scratch chains: "v" gets the rules, "t" is the jump target.
	bt := be.k.newBatch()
	bt.addTable(IPv4, tiny, "")
	for _, table := range []string{main, delta, tiny} {
		bt.addChain(IPv4, table, &Chain{Name: "v"})
		bt.addChain(IPv4, table, &Chain{Name: "t"})
	}
	bt.addChain(IPv4, tiny, &Chain{Name: "u"})
	apply(bt)

	mapOf := func(kind TableKind) *Map {
		for _, m := range be.applied[tableID{IPv4, kind}].Maps {
			if m.Name == mapServiceIPs {
				return m
			}
		}
		b.Fatal("no service-ips map")
		return nil
	}
	elem := Element{Key: Key{Addr: netip.MustParseAddr("10.255.0.1"), Proto: unix.IPPROTO_TCP, Port: 1}, Verdict: GotoChain("t")}

	type variant struct {
		name string
		// tx fills the timed transaction; pre, when set, is applied
		// untimed before it.
		tx, pre func(bt *batch)
	}
	rule := func(table string, terms ...Term) func(*batch) {
		return func(bt *batch) {
			bt.flushChain(IPv4, table, "v")
			bt.addRule(IPv4, table, "v", R(terms...))
		}
	}
	toggle := func(on func(*batch), off func(*batch)) func(*batch) {
		state := false
		return func(bt *batch) {
			state = !state
			if state {
				on(bt)
			} else {
				off(bt)
			}
		}
	}
	port := PortMatch{Port: 1}
	variants := []variant{
		{name: "floor", tx: toggle(
			func(bt *batch) { bt.addChain(IPv4, delta, &Chain{Name: "floor"}) },
			func(bt *batch) { bt.delChain(IPv4, delta, "floor") })},
		{name: "delta-plain", tx: rule(delta, port)},
		{name: "delta-accept", tx: rule(delta, port, Verdict{Kind: Accept})},
		{name: "delta-jump", tx: rule(delta, port, JumpTo("t"))},
		{name: "tiny-jump", tx: rule(tiny, port, JumpTo("t"))},
		{name: "main-jump", tx: rule(main, port, JumpTo("t"))},
		{name: "delta-elem", tx: toggle(
			func(bt *batch) { bt.elements(true, IPv4, delta, mapOf(DeltaTable), []Element{elem}) },
			func(bt *batch) { bt.elements(false, IPv4, delta, mapOf(DeltaTable), []Element{elem}) })},
		{name: "main-elem", tx: toggle(
			func(bt *batch) { bt.elements(true, IPv4, main, mapOf(MainTable), []Element{elem}) },
			func(bt *batch) { bt.elements(false, IPv4, main, mapOf(MainTable), []Element{elem}) })},
		{name: "main-elem-del",
			pre: func(bt *batch) { bt.elements(true, IPv4, main, mapOf(MainTable), []Element{elem}) },
			tx:  func(bt *batch) { bt.elements(false, IPv4, main, mapOf(MainTable), []Element{elem}) }},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				if v.pre != nil {
					b.StopTimer()
					bt := be.k.newBatch()
					v.pre(bt)
					apply(bt)
					b.StartTimer()
				}
				bt := be.k.newBatch()
				v.tx(bt)
				took = append(took, apply(bt))
			}
			b.ReportMetric(median(took).Seconds()*1000, "kernel-median-ms")
		})
	}
	b.Run("change", func(b *testing.B) {
		var took []time.Duration
		for b.Loop() {
			gen++
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

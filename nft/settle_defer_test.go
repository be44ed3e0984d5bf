package nft

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// With DeferSettle, a large full sync returns (and the loop reports it)
// before the transaction that settles it: the generation moves by one in
// Sync, and by one more in Settle or, when nobody called Settle, at the
// start of the next Sync. Either way the drift check counts both as ours
// (nothing read back) and the settle chain is gone.
func TestKernelFullSyncDefersSettle(t *testing.T) {
	for _, settleCalled := range []bool{true, false} {
		t.Run(fmt.Sprintf("settle-called=%v", settleCalled), func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			b := openTestBackendWith(t, ns, BackendConfig{Rules: demoConfig(), CheckEvery: time.Nanosecond,
				Strategy: Strategy{DeferSettle: true}})
			ctx := context.Background()
			st := scaleState(400, 10)
			for range 2 { // the first check after the first sync reads everything back
				if _, err := b.Sync(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			b.Settle()
			b.ForceFull()
			gen := func() uint32 {
				g, err := b.kern().Generation()
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			before := gen()
			res, err := b.Sync(ctx, st)
			if err != nil || !res.Full || res.Messages < settleFrom {
				t.Fatalf("forced full sync: full=%v messages=%d err=%v, want a full one of %d or more", res.Full, res.Messages, err, settleFrom)
			}
			if moved := gen() - before; moved != 1 {
				t.Fatalf("Sync moved the generation by %d, want 1 (the settle deferred)", moved)
			}
			if settleCalled {
				b.Settle()
				if moved := gen() - before; moved != 2 {
					t.Fatalf("Settle moved the generation to +%d, want +2", moved)
				}
			}
			reads := b.kern().reads
			if res, err := b.Sync(ctx, st); err != nil || res.Full || res.Changed {
				t.Fatalf("check after the settle: full=%v changed=%v err=%v, want nothing to do", res.Full, res.Changed, err)
			}
			if moved := gen() - before; moved != 2 {
				t.Errorf("generation moved by %d, want 2 (the full sync and the settle)", moved)
			}
			if b.kern().reads != reads {
				t.Errorf("the check after the settle read the kernel %d times: the settle was taken for drift", b.kern().reads-reads)
			}
			if out := testns.NFT(t, ns, "list", "table", "ip", DefaultTableName); strings.Contains(out, settleChain) {
				t.Errorf("the settle chain is left:\n%s", out)
			}
		})
	}
}

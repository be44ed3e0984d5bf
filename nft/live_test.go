package nft

import (
	"context"
	"sort"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// Reading our tables back from the kernel gives the Ruleset we programmed:
// every chain with the same rules (terms and comments), every map element.
func TestKernelReadRuleset(t *testing.T) {
	for _, tc := range goldenCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			ns := testns.New(t, "knp-nft-")
			b := openTestBackend(t, ns, tc.cfg)
			if _, err := b.Sync(context.Background(), tc.st); err != nil {
				t.Fatal(err)
			}
			k, err := nftlib.OpenKernel(testns.Path(ns))
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			got, err := ReadRuleset(k, tc.cfg.TableName)
			if err != nil {
				t.Fatal(err)
			}
			want := Build(tc.st, tc.cfg)
			if len(got.Tables) != len(want.Tables) {
				t.Fatalf("%d tables read, want %d", len(got.Tables), len(want.Tables))
			}
			for i, wt := range want.Tables {
				gt := got.Tables[i]
				if gt.Family != wt.Family || gt.Name != wt.Name || gt.Comment != wt.Comment || gt.Secondary != wt.Secondary || gt.Sticky != wt.Sticky {
					t.Errorf("table %s %s read as %s %s (comment %q secondary %v affinity %v)", wt.Family, wt.Name, gt.Family, gt.Name, gt.Comment, gt.Secondary, gt.Sticky)
					continue
				}
				if n, m := len(gt.AllChains()), len(wt.AllChains()); n != m {
					t.Errorf("%s %s: %d chains read, want %d", wt.Family, wt.Name, n, m)
				}
				for _, wc := range wt.AllChains() {
					gc := gt.Chain(wc.Name)
					if gc == nil || chainText(wt.Family, gc) != chainText(wt.Family, wc) {
						t.Errorf("%s %s chain %s read back differs:\n got %+v\nwant %+v", wt.Family, wt.Name, wc.Name, gc, wc)
					}
				}
				for _, wm := range wt.Maps {
					if gt.Map(wm.Name) == nil {
						t.Errorf("%s %s: map %s not read", wt.Family, wt.Name, wm.Name)
						continue
					}
					g, w := elementTexts(gt, wm), elementTexts(wt, wm)
					if len(g) != len(w) {
						t.Errorf("%s %s map %s: elements read %q, want %q", wt.Family, wt.Name, wm.Name, g, w)
						continue
					}
					for j := range g {
						if g[j] != w[j] {
							t.Errorf("%s %s map %s: element %q read as %q", wt.Family, wt.Name, wm.Name, w[j], g[j])
						}
					}
				}
			}
		})
	}
}

// chainText is c as nft text (its hook, rules and comments as the kernel
// keeps them, cut to what it holds), in a table of its own.
func chainText(f nftlib.Family, c *nftlib.Chain) string {
	rs := &nftlib.Ruleset{Tables: []*nftlib.Table{{Family: f, Name: "t", Chains: []*nftlib.Chain{c}}}}
	return rs.String()
}

func elementTexts(t *nftlib.Table, m *nftlib.Map) []string {
	var out []string
	for _, e := range t.Elements(m.Name) {
		out = append(out, e.Text(t.Family, m.Key))
	}
	sort.Strings(out)
	return out
}

package ipvs

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

func openHelper(t *testing.T, ns string, cfg proxier.Settings) *NftHelper {
	t.Helper()
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return NewNftHelper(k, cfg, helperState().Node, nil)
}

func elementSet(es []Element) map[Element]bool {
	m := map[Element]bool{}
	for _, e := range es {
		m[e] = true
	}
	return m
}

// The kernel holds exactly what we render, for every kind of element, and
// a restarted helper adopts every element back.
func TestKernelHelperListingMatchesRender(t *testing.T) {
	elems := planElements(BuildPlan(helperState(), Config{}, nodeAddrs))
	for _, tc := range helperCases() {
		t.Run(tc.file, func(t *testing.T) {
			ns := testns.New(t, "knp-ipvs-")
			h := openHelper(t, ns, tc.cfg)
			if _, got, err := h.Read(); err != nil || len(got) != 0 {
				t.Fatalf("first read: %d elements, err %v; want none", len(got), err)
			}
			if err := h.Apply(HelperChange{AddElems: elems}); err != nil {
				t.Fatal(err)
			}
			want := renderHelper(tc.cfg, elems)
			if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(want) {
				t.Errorf("kernel listing differs from render\n--- kernel:\n%s\n--- render:\n%s", got, want)
			}
			// A new helper (a restart) adopts them, and its rewrite keeps them.
			_, got, err := openHelper(t, ns, tc.cfg).Read()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(elementSet(got), elementSet(elems)) || len(got) != len(elems) {
				slices.SortFunc(got, compareElements)
				t.Errorf("read back %d elements, want %d:\n%v\nwant:\n%v", len(got), len(elems), got, elems)
			}
			if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(want) {
				t.Errorf("after the adopting rewrite the kernel differs from render:\n%s", got)
			}
		})
	}
}

// Element changes are one transaction: removing some leaves exactly the
// rest; a change the kernel refuses changes nothing.
func TestKernelHelperApply(t *testing.T) {
	ns := testns.New(t, "knp-ipvs-")
	cfg := helperConfig()
	h := openHelper(t, ns, cfg)
	if _, _, err := h.Read(); err != nil {
		t.Fatal(err)
	}
	elems := planElements(BuildPlan(helperState(), Config{}, nodeAddrs))
	if err := h.Apply(HelperChange{AddElems: elems}); err != nil {
		t.Fatal(err)
	}
	var keep, drop []Element
	for i, e := range elems {
		if i%2 == 0 {
			drop = append(drop, e)
		} else {
			keep = append(keep, e)
		}
	}
	if err := h.Apply(HelperChange{DelElems: drop}); err != nil {
		t.Fatal(err)
	}
	want := renderHelper(cfg, keep)
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(want) {
		t.Errorf("after deleting half:\n%s\n--- want:\n%s", got, want)
	}
	// Adding one back and deleting one that is gone: refused as a whole.
	err := h.Apply(HelperChange{AddElems: drop[:1], DelElems: drop[1:2]})
	if err == nil {
		t.Fatal("deleting a missing element succeeded")
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(want) {
		t.Errorf("a refused change changed the kernel:\n%s", got)
	}
	// Someone changes a set's type behind our back: Read replaces the set
	// (its elements are gone, and Read says so) and keeps the others.
	testns.NFT(t, ns, "delete", "table", "ip", HelperTableName)
	testns.NFT(t, ns, "add", "table", "ip", HelperTableName)
	testns.NFT(t, ns, "add", "set", "ip", HelperTableName, SetIPVSIPs, "{ type inet_service; }")
	testns.NFT(t, ns, "add", "element", "ip", HelperTableName, SetIPVSIPs, "{ 80 }")
	_, got, err := h.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range got {
		if !e.V6 {
			t.Errorf("adopted %v from a table that held none of ours", e)
		}
	}
	var v6 []Element
	for _, e := range keep {
		if e.V6 {
			v6 = append(v6, e)
		}
	}
	if want := renderHelper(cfg, v6); testutil.SortedText(testns.NFT(t, ns, "list", "ruleset")) != testutil.SortedText(want) {
		t.Errorf("after Read repaired the ip table:\n%s\n--- want:\n%s", testns.NFT(t, ns, "list", "ruleset"), want)
	}
}

// CleanupHelpers deletes both helper tables in one transaction, and says
// so only when there were any.
func TestKernelCleanupHelperTables(t *testing.T) {
	ns := testns.New(t, "knp-ipvs-")
	h := openHelper(t, ns, helperConfig())
	if _, _, err := h.Read(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		removed, err := CleanupHelpers(h.k, testns.Path(ns))
		if err != nil || removed != want {
			t.Fatalf("cleanup %d: removed %v, err %v; want removed %v", i+1, removed, err, want)
		}
		if got := testns.NFT(t, ns, "list", "tables"); strings.Contains(got, HelperTableName) {
			t.Fatalf("cleanup %d left %q", i+1, got)
		}
	}
}

package nftlib

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// countedRuleset has two tables Count is asked about (kube-a, kube-b),
// with maps, an interval set and anonymous sets, and one it is not.
const countedRuleset = `
table ip kube-a {
	map m {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.0.0.1 . tcp . 80 : goto c1, 10.0.0.2 . udp . 53 : goto c2 }
	}
	set s {
		type ipv4_addr
		flags interval
		elements = { 100.64.0.0/24 }
	}
	chain c1 {
		ip saddr 100.64.0.7 meta mark set 0x4000
		meta l4proto tcp dnat to 100.64.0.7:8080
	}
	chain c2 {
		numgen random mod 2 vmap { 0 : goto c1, 1 : goto c3 }
	}
	chain c3 {
	}
}
table ip6 kube-b {
	chain c {
		ip6 daddr { fd00::1, fd00::2, fd00::3 } accept
	}
}
table ip other {
	chain x {
		ip daddr 100.64.0.9 accept
	}
	set y {
		type ipv4_addr
		elements = { 100.64.0.10 }
	}
}
`

// Count counts what a ruleset written by nft holds, in the tables asked
// for, anonymous sets included, and hands over the constants in it.
func TestKernelCount(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, countedRuleset)
	k := openTestKernel(t, ns)

	seen := map[netip.Addr]bool{}
	c, err := k.Count(func(table string) bool { return strings.HasPrefix(table, "kube-") }, func(v []byte) {
		if len(v) >= 4 && v[0] == 100 {
			seen[netip.AddrFrom4([4]byte(v[:4]))] = true
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// Sets: m, s (an interval set), c2's anonymous vmap and c's anonymous
	// set. Elements: 2 in m, 3 in s (the kernel's elements of an interval
	// set are its bounds: nft adds an end at 0.0.0.0 before the first
	// interval, then the interval's start and end), 2 in the vmap, 3 in c's
	// set.
	want := Census{Tables: 2, Chains: 4, Rules: 4, Sets: 4, Elements: 10}
	if c != want {
		t.Errorf("counted %+v, want %+v", c, want)
	}
	for _, a := range []string{"100.64.0.7", "100.64.0.0", "100.64.1.0"} {
		if !seen[netip.MustParseAddr(a)] {
			t.Errorf("value %s not handed over (got %v)", a, seen)
		}
	}
	for _, a := range []string{"100.64.0.9", "100.64.0.10"} {
		if seen[netip.MustParseAddr(a)] {
			t.Errorf("value %s of a table not asked for handed over", a)
		}
	}
}

// Count agrees with nft's own listing of every table.
func TestKernelCountMatchesListing(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, countedRuleset)
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(testns.NFT(t, ns, "-j", "list", "ruleset")), &doc); err != nil {
		t.Fatal(err)
	}
	var want Census
	for _, o := range doc.Nftables {
		for kind := range o {
			switch kind {
			case "table":
				want.Tables++
			case "chain":
				want.Chains++
			case "rule":
				want.Rules++
			}
		}
	}
	got, err := openTestKernel(t, ns).Count(func(string) bool { return true }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tables != want.Tables || got.Chains != want.Chains || got.Rules != want.Rules {
		t.Errorf("counted %+v, nft lists %d tables, %d chains, %d rules", got, want.Tables, want.Chains, want.Rules)
	}
	if got.Elements == 0 {
		t.Error("no elements counted")
	}
}

package nftlib

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
)

// A comment is clamped to what nft keeps: at most MaxComment bytes of valid
// UTF-8, without quotes or backslashes, and clamping twice changes nothing.
func TestClampComment(t *testing.T) {
	for _, c := range []string{"", "plain", strings.Repeat("a", 200), strings.Repeat("é", 100), strings.Repeat("服", 60),
		"a\"b\\c\x00d\xffe", "\u200b zero width"} {
		got := clampComment(c)
		if len(got) > MaxComment || !utf8.ValidString(got) || strings.ContainsAny(got, "\"\\") {
			t.Errorf("clampComment(%q) = %q: %d bytes, valid UTF-8 %v", c, got, len(got), utf8.ValidString(got))
		}
		if clampComment(got) != got {
			t.Errorf("clampComment is not idempotent on %q", c)
		}
	}
}

// unicodeTable has comments of multi-byte UTF-8 with a quote and a
// backslash, long enough to be clamped, on its table, a chain, a rule, a
// map and an element.
func unicodeTable() *Table {
	long := `ns"\` + strings.Repeat("ñ", 40) + "/" + strings.Repeat("服务", 10) + ":ポート-é"
	return &Table{Family: IPv4, Name: "t", Comment: long,
		Maps: []*Map{{Name: "m", Key: []Field{FieldDaddr}, Comment: long, Elements: []Element{
			{Key: Key{Addr: netip.MustParseAddr("10.96.7.7")}, Verdict: GotoChain("c"), Comment: long}}}},
		Chains: []*Chain{
			{Name: "c", Comment: long, Rules: []Rule{R(ProtoMatch{Proto: unix.IPPROTO_TCP}, DNAT{Addr: netip.MustParseAddr("10.244.7.1"), Port: 8080}).WithComment(long)}},
			{Name: "entry", Hook: &Hook{Type: "nat", Hook: "prerouting", Priority: -100}, Rules: []Rule{R(Vmap("m", FieldDaddr))}},
		}}
}

// nft accepts what render prints for such comments, and the kernel, once
// given the table, holds exactly that: as nft lists it, and as read back
// and compared.
func TestKernelUnicodeComments(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	want := unicodeTable()
	text := (&Ruleset{Tables: []*Table{want}}).String()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f refused the render: %v\n%s\n%s", err, out, text)
	}
	k := openTestKernel(t, ns)
	tx := k.NewTx()
	x, _ := FullTx(want, &KernelTable{}, false)
	var setID uint32
	x.Write(tx, &setID)
	if err := k.CommitTx(tx); err != nil {
		t.Fatal(err)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(text) {
		t.Errorf("kernel differs from render:\n%s\n--- want:\n%s", got, text)
	}
	got, err := k.ReadTable(IPv4, "t", want)
	if err != nil {
		t.Fatal(err)
	}
	checkReadBackEqual(t, k, want, got)
}

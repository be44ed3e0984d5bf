package nftlib

import (
	"fmt"
	"testing"
)

// describe names every message of a batch, runs of like messages included.
func TestBatchDescribe(t *testing.T) {
	b := newBatch(100)
	c := &Chain{Name: "KUBE-SVC-X", Rules: []Rule{R(Verdict{Kind: Drop}), R(Verdict{Kind: Accept})}}
	b.AddChain(IPv4, "t", c)
	for _, r := range c.Rules {
		b.AddRule(IPv4, "t", c.Name, r)
	}
	b.AddRule(IPv4, "t", "KUBE-SVC-Y", R(Verdict{Kind: Drop}))
	b.DelChain(IPv4, "t", "KUBE-SEP-Z")
	if got := b.Messages(); got != 5 {
		t.Errorf("messages() = %d, want 5", got)
	}
	want := []string{"batch begin", "add chain KUBE-SVC-X", "add rule to KUBE-SVC-X", "add rule to KUBE-SVC-X",
		"add rule to KUBE-SVC-Y", "delete chain KUBE-SEP-Z"}
	for i, w := range want {
		if got := b.describe(uint32(100 + i)); got != w {
			t.Errorf("describe(%d) = %q, want %q", 100+i, got, w)
		}
	}
	if _, _, err := b.finish(); err != nil {
		t.Fatal(err)
	}
	if got, w := b.describe(106), "batch end"; got != w {
		t.Errorf("describe(106) = %q, want %q", got, w)
	}
	for _, seq := range []uint32{99, 107} {
		if got, w := b.describe(seq), fmt.Sprintf("message %d", seq); got != w {
			t.Errorf("describe(%d) = %q, want %q", seq, got, w)
		}
	}
}

package nft

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/internal/testutil"
	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// unicodeState has a Service whose names are multi-byte UTF-8 (and a quote
// and a backslash), long enough to push every comment past nft's limit.
func unicodeState() *model.State {
	st := model.NewState()
	n := proxierName(strings.Repeat("ñ", 40), strings.Repeat("服务", 10)+`"\`, "ポート-é")
	st.Services = st.Services.With(n, &model.ServicePort{Name: n, Protocol: model.TCP, Port: 80, NodePort: 30111,
		ClusterIPs:  []netip.Addr{mustAddr("10.96.7.7")},
		ExternalIPs: []netip.Addr{mustAddr("192.0.2.77")}})
	st.Endpoints = st.Endpoints.With(n, []model.Endpoint{
		{Addr: mustAddr("10.244.7.1"), Port: 8080, Ready: true, Serving: true},
		{Addr: mustAddr("10.244.7.2"), Port: 8080, Ready: true, Serving: true},
	})
	return st
}

// nft accepts what render prints for such names, and the kernel, read back
// by nft, holds exactly that.
func TestKernelUnicodeComments(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	st, cfg := unicodeState(), demoConfig()
	text := Build(st, cfg).String()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c -f refused the render: %v\n%s\n%s", err, out, text)
	}
	b := openTestBackend(t, ns, cfg)
	if _, err := b.Sync(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if got := testns.NFT(t, ns, "list", "ruleset"); testutil.SortedText(got) != testutil.SortedText(text) {
		t.Errorf("kernel differs from render:\n%s\n--- want:\n%s", got, text)
	}
	if d := readBackDrift(t, b, b.appliedTables(tableIDs())); len(d) > 0 {
		t.Errorf("read-back differs: %v", d)
	}
}

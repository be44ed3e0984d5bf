package upstream

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/testbin"
)

// TestUpstreamNFTablesDiff: upstream kube-proxy v1.37.1 in nftables mode and
// kube-nftproxy in nftables mode program the same Services (those of
// TestUpstreamIPTablesDiff) in namespaces of their own; `diff
// --nft-ruleset` of upstream's `nft list ruleset` against our live tables
// says equal for every Service port, and names the one Service port whose
// endpoint is then changed in the listing.
func TestUpstreamNFTablesDiff(t *testing.T) {
	t.Parallel()
	kubeProxy := needTools(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skipf("skipping: %v (apt-get install nftables: the listing of upstream's tables)", err)
	}
	dir := t.TempDir()
	ours, err := testbin.Build(testbin.Module+"/cmd/kube-nftproxy", dir)
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, dir, ours)
	createObjects(e)
	wantPorts := 1 // default/kubernetes:https
	for _, s := range featureServices() {
		wantPorts += len(s.svc.Ports) * len(s.svc.IPFamilies)
	}
	cidrs := "10.244.0.0/16,fd00:10:244::/48"
	taken := map[int]bool{}
	common := []string{"--proxy-mode=nftables", "--hostname-override", localNode, "--cluster-cidr", cidrs, "--iptables-min-sync-period=100ms"}
	up := start(t, "kube-proxy", e.upNS, filepath.Join(dir, "kube-proxy.log"), nil,
		append([]string{kubeProxy, "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.1.1", dir),
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.upNS, taken)),
			"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.upNS, taken)),
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0", "--v=2"}, common...)...)
	ou := start(t, "kube-nftproxy", e.ouNS, filepath.Join(dir, "kube-nftproxy.log"), nil,
		append([]string{ours, "--kubeconfig", kubeconfigVia(t, e.srv, "10.123.2.1", dir),
			"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.ouNS, taken)),
			"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", freePort(t, e.ouNS, taken))}, common...)...)

	listing := filepath.Join(dir, "nft-ruleset.txt")
	out := converge(t, []*process{up, ou}, wantPorts, func() (string, int) {
		e.saveListing(listing)
		return e.diffNFT(listing)
	})
	var code int // of the diffs below
	t.Logf("diff of upstream's nft list ruleset against our live tables:\n%s", out)
	if d := os.Getenv("KNP_SAVE_NFT_DUMP"); d != "" { // refresh migrate/testdata/upstream-nftables
		b, _ := os.ReadFile(listing)
		_ = os.WriteFile(filepath.Join(d, "nft-ruleset.txt"), b, 0o644)
		e.saveObjects(d)
	}

	// One side only, in the listing: np's remote endpoint moves.
	b, _ := os.ReadFile(listing)
	np := regexp.MustCompile(`(?m)^(\s*chain service-[A-Z0-9]+-default/np/tcp/http \{\n(?:.*\n)*?.*)10\.244\.1\.21 \. 8080`)
	if !np.Match(b) {
		t.Fatalf("upstream's listing lacks np's endpoint 10.244.1.21:8080:\n%s", b)
	}
	edited := filepath.Join(dir, "nft-ruleset-edited.txt")
	if err := os.WriteFile(edited, np.ReplaceAll(b, []byte("${1}10.244.1.99 . 8080")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = e.diffNFT(edited)
	t.Logf("after editing np's endpoint in the listing:\n%s", out)
	checkOnlyDifferent(t, out, code, "default/np:http tcp: different: ", "endpoints: nft has cluster endpoints 10.244.1.99:8080 33.33%; ours has cluster endpoints 10.244.1.21:8080 33.33%")
}

// saveListing writes `nft list ruleset` of upstream's namespace to path.
func (e *testEnv) saveListing(path string) {
	out, err := exec.Command("ip", "netns", "exec", e.upNS, "nft", "list", "ruleset").Output()
	if err != nil {
		e.t.Fatalf("nft list ruleset in %s: %v", e.upNS, err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// diffNFT runs `kube-nftproxy diff --nft-ruleset` in our namespace against
// the listing and returns its output and exit code.
func (e *testEnv) diffNFT(listing string) (string, int) {
	out, err := exec.Command("ip", "netns", "exec", e.ouNS, e.ours, "diff", "--nft-ruleset", listing).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	e.t.Fatalf("diff --nft-ruleset: %v", err)
	return "", -1
}

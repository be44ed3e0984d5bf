package upstream

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestUpstreamIPTablesDiffNoExternalIPs: with the feature gate
// AllowServiceExternalIPs off on both, upstream kube-proxy v1.37.1 in
// iptables mode and ours program the same thing for every Service port
// (diff: equal, ext and ext-empty included, and ext-empty's known
// difference about its external IP gone), and neither side's rules name
// ext's or ext-empty's external IP; ours logs one line for each of the two.
func TestUpstreamIPTablesDiffNoExternalIPs(t *testing.T) {
	t.Parallel()
	pp := startPair(t, "iptables", "--feature-gates=AllowServiceExternalIPs=false")
	e := pp.env
	wantPorts := 1 // default/kubernetes:https
	var extIPs []string
	for _, s := range featureServices() {
		wantPorts += len(s.svc.Ports) * len(s.svc.IPFamilies)
		extIPs = append(extIPs, s.svc.ExternalIPs...)
	}
	if len(extIPs) != 2 {
		t.Fatalf("featureServices has external IPs %v; the test expects ext's and ext-empty's", extIPs)
	}
	out := converge(t, []*process{pp.up.proc, pp.ours.proc}, wantPorts, func() (string, int) {
		return e.diff(e.dumps("")...)
	})
	t.Logf("diff with AllowServiceExternalIPs=false on both:\n%s", out)
	// ext-empty's external IP, unprogrammed, has no known difference left.
	if !slices.Contains(strings.Split(out, "\n"), "default/ext-empty:http tcp: equal") {
		t.Errorf("diff has no line saying ext-empty is equal with no known difference")
	}
	ours, err := exec.Command("ip", "netns", "exec", e.ouNS, "nft", "list", "ruleset").Output()
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v", e.ouNS, err)
	}
	sides := map[string]string{"ours (nft list ruleset)": string(ours)}
	for _, d := range e.dumps("-final") {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		sides["upstream ("+d+")"] = string(b)
	}
	for who, text := range sides {
		for _, ip := range extIPs {
			if strings.Contains(text, ip) {
				t.Errorf("%s names external IP %s", who, ip)
			}
		}
	}
	log, err := os.ReadFile(pp.ours.proc.log)
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"default/ext", "default/ext-empty"} {
		want := `"Ignoring the Service's externalIPs: feature gate AllowServiceExternalIPs is disabled" service="` + svc + `"`
		if n := strings.Count(string(log), want); n != 1 {
			t.Errorf("our log has %d lines %s, want 1", n, want)
		}
	}
}

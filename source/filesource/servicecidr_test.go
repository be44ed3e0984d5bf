package filesource

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ServiceCIDR objects in the state files, alone or in a ServiceCIDRList,
// give the State their ranges.
func TestLoadStateServiceCIDRs(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cidr.yaml": `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16, "fd00:10:96::/112"]}
`,
		"list.yaml": `apiVersion: networking.k8s.io/v1
kind: ServiceCIDRList
items:
- metadata: {name: extra}
  spec: {cidrs: [10.97.0.0/16]}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, problems := LoadState(dir, "node-1")
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.97.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")}
	if !slices.Equal(st.ServiceCIDRs, want) {
		t.Errorf("ServiceCIDRs %v, want %v", st.ServiceCIDRs, want)
	}
}

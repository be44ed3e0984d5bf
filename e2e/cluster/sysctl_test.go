package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSysctlsRoundTrip saves the kubelet-managed sysctls and restores
// them unchanged (no write happens when a value is already right), and
// ignores keys that are not kubelet's.
func TestSysctlsRoundTrip(t *testing.T) {
	l := testLayout(t)
	if err := l.saveSysctls(); err != nil {
		t.Fatal(err)
	}
	saved, err := os.ReadFile(filepath.Join(l.Dir, sysctlFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(saved), "vm/overcommit_memory ") {
		t.Errorf("saved = %q", saved)
	}
	if errs := restoreSysctls(string(saved) + "net/ipv4/ip_forward 1\n"); len(errs) > 0 {
		t.Error(errs)
	}
}

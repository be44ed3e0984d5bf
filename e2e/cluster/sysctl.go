package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// kubeletSysctls are the machine-wide (not per network namespace) kernel
// settings kubelet sets at start unless protectKernelDefaults, which
// instead makes it refuse to start when they differ. Up saves them before
// the first kubelet starts and Down puts them back.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

const sysctlFile = "saved-sysctls"

// saveSysctls records the current values of kubeletSysctls in Dir.
func (l Layout) saveSysctls() error {
	var b strings.Builder
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			continue
		}
		fmt.Fprintf(&b, "%s %s\n", k, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(filepath.Join(l.Dir, sysctlFile), []byte(b.String()), 0o644)
}

// restoreSysctls writes back the values saveSysctls recorded; saved is
// that file's content.
func restoreSysctls(saved string) []error {
	var errs []error
	for _, line := range strings.Split(saved, "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok || !contains(kubeletSysctls, k) {
			continue
		}
		p := filepath.Join("/proc/sys", k)
		cur, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s=%s: %w", k, v, err))
		}
	}
	return errs
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

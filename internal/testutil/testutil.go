// Package testutil holds the helpers that tests of several packages share:
// waiting for a condition with a deadline, comparing nft listings whatever
// the kernel's order, and a unified diff. Tests only. (Network namespaces
// and nft runs are in internal/testns, golden files in internal/golden.)
package testutil

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails t when that takes longer
// than timeout; what names the awaited state in the failure.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; !cond(); wait = min(2*wait, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(wait)
	}
}

// LockTable is how `nft list ruleset` opens the table of a running
// proxy's instance lock (internal/instance: TableFamily, TableName), and
// RecordTable the record of the sysctls it changed (sysctlrecord).
const (
	LockTable   = "table ip kube-nftproxy-lock {"
	RecordTable = "table ip kube-nftproxy-sysctls {"
)

// SortedListing is an nft listing's lines, trimmed and sorted, with set and
// map elements one per line: two listings that differ only in the kernel's
// order (of tables, chains, elements) compare equal. A running proxy's
// lock table and its sysctl record are left out: they hold no rules,
// render never prints them, and they name the proxy's pid and the node's
// sysctls.
func SortedListing(listing string) []string {
	var out []string
	depth := 0 // inside a left-out table: the braces open
	for l := range strings.Lines(listing) {
		l = strings.TrimSpace(l)
		if depth == 0 && (strings.HasPrefix(l, LockTable) || strings.HasPrefix(l, RecordTable)) {
			depth = 1
			continue
		}
		if depth > 0 {
			depth += strings.Count(l, "{") - strings.Count(l, "}")
			continue
		}
		if strings.HasPrefix(l, "#") {
			continue // a comment (render names its mode), not a rule
		}
		l = strings.TrimPrefix(l, "elements = { ")
		l = strings.TrimSuffix(strings.TrimSuffix(l, " }"), ",")
		if l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// SortedText is SortedListing as one string, for comparing and printing.
func SortedText(listing string) string { return strings.Join(SortedListing(listing), "\n") }

// ListingDiff describes how two sorted listings, got and want, differ: ""
// when they do not, else the lines only one of them has (the first few),
// calling them by the names given.
func ListingDiff(got, want []string, gotName, wantName string) string {
	count := map[string]int{}
	for _, l := range got {
		count[l]++
	}
	for _, l := range want {
		count[l]--
	}
	var extra, missing []string
	for _, l := range slices.Sorted(maps.Keys(count)) {
		for n := count[l]; n > 0; n-- {
			extra = append(extra, l)
		}
		for n := count[l]; n < 0; n++ {
			missing = append(missing, l)
		}
	}
	if len(extra) == 0 && len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%d lines only in %s %q; %d lines only in %s %q",
		len(extra), gotName, firstN(extra, 8), len(missing), wantName, firstN(missing, 8))
}

func firstN(s []string, n int) []string { return s[:min(len(s), n)] }

// Diff returns `diff -u want got`: how got differs from want, line by line.
func Diff(t testing.TB, want, got string) string {
	t.Helper()
	dir := t.TempDir()
	w, g := filepath.Join(dir, "want"), filepath.Join(dir, "got")
	if err := os.WriteFile(w, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g, []byte(got), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("diff", "-u", w, g).CombinedOutput()
	return string(out)
}

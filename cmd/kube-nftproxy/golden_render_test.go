package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/golden"
)

// nft's golden cases are what a user gives render: each directory's YAML
// as --state and its flags file as the flags render the case's ruleset
// byte for byte. This also keeps nft's own reading of the flags files
// (nft/golden_test.go, which cannot import this package) honest.
func TestRenderGoldenCases(t *testing.T) {
	const root = "../../nft/testdata/golden"
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) {
			dir := filepath.Join(root, e.Name())
			args := append([]string{"render", "--state", dir}, mustFlags(t, filepath.Join(dir, "flags"))...)
			out, err := run(args...)
			if err != nil {
				t.Fatalf("kube-nftproxy %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			want, err := os.ReadFile(filepath.Join(dir, e.Name()+".nft"))
			if err != nil {
				t.Fatal(err)
			}
			_, out, _ = strings.Cut(out, "\n") // the mode it assumed, a comment
			if out != string(want) {
				t.Errorf("kube-nftproxy %s differs from %s.nft:\n%s", strings.Join(args, " "), e.Name(), out)
			}
		})
	}
}

// mustFlags reads a golden case's flags file.
func mustFlags(t *testing.T, path string) []string {
	t.Helper()
	args, err := golden.FlagsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return args
}

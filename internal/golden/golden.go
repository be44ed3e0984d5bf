// Package golden compares a test's output with a file under testdata, and
// rewrites the file when the test binary runs with -update. Tests only.
package golden

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// Check fails t when got differs from testdata/name, printing got; with
// -update it writes got there first. what names the output in messages.
func Check(t testing.TB, name, what, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n%s", what, path, got)
	}
}

// FlagsFile reads command-line flags from a file, one a line; blank lines
// and lines starting with # are left out (golden cases keep their flags so).
func FlagsFile(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading flags: %w", err)
	}
	var args []string
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			args = append(args, line)
		}
	}
	return args, nil
}

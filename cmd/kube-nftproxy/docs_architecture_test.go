package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// architectureDoc is the doc whose package map TestArchitecturePackageMap
// checks.
const architectureDoc = "../../docs/architecture.md"

// TestArchitecturePackageMap checks docs/architecture.md's package map
// against `go list`: every package of the module but e2e/... has a row,
// every package a row names exists, and a row's imports column lists the
// project's packages that package imports (test files left out), no more
// and no fewer. So a package moved, added or given a new import shows in
// the map a newcomer reads first.
func TestArchitecturePackageMap(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the packages with")
	}
	doc, err := os.ReadFile(architectureDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented, err := packageMap(string(doc))
	if err != nil {
		t.Fatalf("%s: %v", architectureDoc, err)
	}
	listed := listOwnImports(t, goTool)
	for _, pkg := range slices.Sorted(maps.Keys(listed)) {
		imports, ok := documented[pkg]
		if !ok {
			t.Errorf("package %s has no row in %s's package map", pkg, architectureDoc)
			continue
		}
		if !slices.Equal(imports, listed[pkg]) {
			t.Errorf("%s: the package map says %s imports %s; go list says %s",
				architectureDoc, pkg, orNone(imports), orNone(listed[pkg]))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(documented)) {
		if _, ok := listed[pkg]; !ok {
			t.Errorf("%s's package map names %s, which go list does not know", architectureDoc, pkg)
		}
	}
}

func TestPackageMapParsesRows(t *testing.T) {
	doc := "## Package map\n\n| package | its one job | imports |\n| --- | --- | --- |\n" +
		"| `a` | does a | `b`, `c/d` |\n" +
		"| `b`, `c/d` | helpers | —; `b` |\n" +
		"| `e2e/...` | tests | the binary |\n\n## Next\n\n| `x` | not in the map | — |\n"
	got, err := packageMap(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"a": {"b", "c/d"}, "b": nil, "c/d": {"b"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("packageMap = %v, want %v", got, want)
	}
	if _, err := packageMap("## Package map\n\n| `a`, `b` | two | `c` |\n"); err == nil {
		t.Error("a row of two packages with one imports list parsed without an error")
	}
}

// backticked are the names a table cell spells in backticks.
var backticked = regexp.MustCompile("`([^`]+)`")

// packageMap reads the table under "## Package map": per package, the
// imports its row lists (sorted; nil for "—"). A row of several packages
// lists their imports in the same order, separated by ";". The row of
// e2e/... is left out.
func packageMap(doc string) (map[string][]string, error) {
	_, section, ok := strings.Cut(doc, "## Package map\n")
	if !ok {
		return nil, fmt.Errorf("no section %q", "## Package map")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string][]string{}
	for line := range strings.Lines(section) {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
		if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(cells[0]), "`") {
			continue // not a package's row: the header, its rule, prose
		}
		var pkgs []string
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			pkgs = append(pkgs, m[1])
		}
		if slices.Contains(pkgs, "e2e/...") {
			continue
		}
		lists := strings.Split(cells[len(cells)-1], ";")
		if len(lists) != len(pkgs) {
			return nil, fmt.Errorf("row of %s has %d imports lists, want one per package", strings.Join(pkgs, ", "), len(lists))
		}
		for i, pkg := range pkgs {
			var imports []string
			for _, m := range backticked.FindAllStringSubmatch(lists[i], -1) {
				imports = append(imports, m[1])
			}
			slices.Sort(imports)
			out[pkg] = imports
		}
	}
	return out, nil
}

// listOwnImports lists the module's packages but e2e/... with the module's
// packages each imports (test files left out), relative to the module.
func listOwnImports(t *testing.T, goTool string) map[string][]string {
	t.Helper()
	cmd := exec.Command(goTool, "list", "-f", "{{.Module.Path}} {{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	listed := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		prefix := fields[0] + "/"
		pkg := strings.TrimPrefix(fields[1], prefix)
		if pkg == "e2e" || strings.HasPrefix(pkg, "e2e/") {
			continue
		}
		var imports []string
		for _, imp := range fields[2:] {
			if own, ok := strings.CutPrefix(imp, prefix); ok {
				imports = append(imports, own)
			}
		}
		slices.Sort(imports)
		listed[pkg] = imports
	}
	return listed
}

// orNone spells a list of imports for a message.
func orNone(imports []string) string {
	if len(imports) == 0 {
		return "nothing of ours"
	}
	return strings.Join(imports, ", ")
}

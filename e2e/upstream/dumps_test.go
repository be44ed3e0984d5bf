package upstream

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// checkedInDumps are the copies of upstream's dumps the fast tests of
// migrate (the mutation suite among them) read.
const checkedInDumps = "../../migrate/testdata/upstream-localhost"

// checkDumpsCurrent compares a fresh run's dumps with the checked-in
// copies, as sets of rules and chains per table: the order of
// kube-proxy's rules between Services, its counters and the dates vary
// from run to run, nothing else. KNP_SAVE_DUMPS refreshes the copies.
func checkDumpsCurrent(t *testing.T, fresh []string) {
	t.Helper()
	for _, path := range fresh {
		name := filepath.Base(path)
		want, err := os.ReadFile(filepath.Join(checkedInDumps, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		only, missing := lineDiff(normalDump(string(got)), normalDump(string(want)))
		if len(only) > 0 || len(missing) > 0 {
			t.Errorf("upstream kube-proxy's %s differs from %s/%s (refresh it with KNP_SAVE_DUMPS=%s if upstream changed):\n  new: %q\n  gone: %q",
				name, checkedInDumps, name, checkedInDumps, only, missing)
		}
	}
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// normalDump is a dump's lines without comments and counters, each prefixed
// by its table, sorted.
func normalDump(s string) []string {
	var out []string
	table := ""
	for _, l := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(l, "#"), l == "", l == "COMMIT":
		case strings.HasPrefix(l, "*"):
			table = l
		default:
			out = append(out, table+" "+counters.ReplaceAllString(l, ""))
		}
	}
	slices.Sort(out)
	return out
}

func lineDiff(a, b []string) (onlyA, onlyB []string) {
	in := map[string]int{}
	for _, l := range b {
		in[l]++
	}
	for _, l := range a {
		if in[l] > 0 {
			in[l]--
			continue
		}
		onlyA = append(onlyA, l)
	}
	for _, l := range b {
		if in[l] > 0 {
			in[l]--
			onlyB = append(onlyB, l)
		}
	}
	return onlyA, onlyB
}

// equalPorts counts the Service port lines of diff's report saying equal
// (the node-wide lines name known differences too).
func equalPorts(out string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if servicePortLine.MatchString(l) && strings.Contains(l, ": equal") {
			n++
		}
	}
	return n
}

// converge runs diff until it reports wantPorts equal Service ports (exit
// 0), failing the test when a proxy exits or after 90 s; it returns the
// last report.
func converge(t *testing.T, procs []*process, wantPorts int, diff func() (string, int)) string {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		for _, p := range procs {
			if err := p.exited(); err != nil {
				t.Fatal(err)
			}
		}
		out, code := diff()
		if code == 0 && equalPorts(out) == wantPorts {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("diff did not report %d equal Service ports within 90s (exit %d):\n%s", wantPorts, code, out)
		}
		time.Sleep(500 * time.Millisecond) // a poll: each round runs a diff anyway
	}
}

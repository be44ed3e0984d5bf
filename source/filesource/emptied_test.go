package filesource

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fileStep is one change to a state directory and what a reload must
// make of it.
type fileStep struct {
	do func(t *testing.T, dir string)
	// want are the Service ports of the state after the reload.
	want []string
	// held, failed and removed count the files held as still being
	// written, the files refused, and the Services whose removal is logged.
	held, failed, removed int
	// failure is a string the failure's message must hold.
	failure string
}

const (
	twoServices  = "---\napiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: default}\nspec:\n  clusterIP: 10.96.0.1\n  ports: [{name: http, port: 80}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: default}\nspec:\n  clusterIP: 10.96.0.2\n  ports: [{name: http, port: 80}]\n"
	invalidYAML  = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: default\n"
	emptyList    = "apiVersion: v1\nkind: List\nitems: []\n"
	otherService = "apiVersion: v1\nkind: Service\nmetadata: {name: o, namespace: default}\nspec:\n  clusterIP: 10.96.9.9\n  ports: [{name: http, port: 80}]\n"
)

var (
	withAB = []string{"default/a:http", "default/b:http", "default/o:http"}
	onlyO  = []string{"default/o:http"}
)

func writeStep(name, body string) func(*testing.T, string) {
	return func(t *testing.T, dir string) { write(t, filepath.Join(dir, name), body) }
}

func renameStep(from, to string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
			t.Fatal(err)
		}
	}
}

func removeStep(name string) func(*testing.T, string) {
	return func(t *testing.T, dir string) {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEmptiedOrRenamedStateFile: a state file truncated to nothing, or
// made invalid and then renamed, never takes its Services away; removing
// the file, renaming it out of the manifests, or writing a document without
// objects does, and says so.
func TestEmptiedOrRenamedStateFile(t *testing.T) {
	for _, tt := range emptiedOrRenamedCases {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "s.yaml"), twoServices)
			write(t, filepath.Join(dir, "o.yaml"), otherService)
			set, err := newFileSet(dir, "node-1")
			if err != nil {
				t.Fatal(err)
			}
			set.holdFor = tt.holdFor
			if res := set.reload(); !res.complete {
				t.Fatalf("first load: %+v", res)
			}
			for i, step := range tt.steps {
				step.check(t, i, dir, set)
			}
		})
	}
}

// check applies the step to dir and checks what a reload of set makes of it.
func (step fileStep) check(t *testing.T, i int, dir string, set *fileSet) {
	t.Helper()
	step.do(t, dir)
	res := set.reload()
	got := names(set.b.State())
	var removed []string
	for _, r := range res.removed {
		removed = append(removed, r.namespace+"/"+r.name)
	}
	if !slices.Equal(got, step.want) || res.held != step.held || len(res.failures) != step.failed || len(res.removed) != step.removed {
		t.Fatalf("step %d: state %v, held %d, failures %v, removed %v; want state %v, held %d, %d failures, %d removed",
			i, got, res.held, res.failures, removed, step.want, step.held, step.failed, step.removed)
	}
	if step.failure != "" && !strings.Contains(res.failures[0].Error(), step.failure) {
		t.Errorf("step %d: failure %q lacks %q", i, res.failures[0], step.failure)
	}
}

// emptiedOrRenamedCases start from s.yaml (Services a and b) and o.yaml
// (Service o).
var emptiedOrRenamedCases = []struct {
	name    string
	holdFor time.Duration
	steps   []fileStep
}{{
	name: "emptied, then written again: held meanwhile", holdFor: time.Hour,
	steps: []fileStep{
		{do: writeStep("s.yaml", ""), want: withAB, held: 1},
		{do: writeStep("s.yaml", twoServices+svcYAML("c", "10.96.0.3")), want: []string{"default/a:http", "default/b:http", "default/c:http", "default/o:http"}},
	},
}, {
	name: "emptied and left so: refused, its Services kept until it changes",
	steps: []fileStep{
		{do: writeStep("s.yaml", ""), want: withAB, failed: 1, failure: "empty"},
		{do: writeStep("s.yaml", twoServices), want: withAB},
	},
}, {
	name: "emptied on purpose with a List without items",
	steps: []fileStep{
		{do: writeStep("s.yaml", emptyList), want: onlyO, removed: 2},
	},
}, {
	name: "emptied on purpose with nothing but a comment",
	steps: []fileStep{
		{do: writeStep("s.yaml", "# no Services here any more\n"), want: onlyO, removed: 2},
	},
}, {
	name: "removed on purpose",
	steps: []fileStep{
		{do: removeStep("s.yaml"), want: onlyO, removed: 2},
	},
}, {
	name: "emptied, then removed while held",
	steps: []fileStep{
		{do: writeStep("s.yaml", ""), want: withAB, failed: 1},
		{do: removeStep("s.yaml"), want: onlyO, removed: 2},
	},
}, {
	name: "a file that never held objects may be empty",
	steps: []fileStep{
		{do: writeStep("new.yaml", ""), want: withAB},
		{do: writeStep("new.yaml", svcYAML("new", "10.96.0.4")), want: []string{"default/a:http", "default/b:http", "default/new:http", "default/o:http"}},
		{do: writeStep("new.yaml", emptyList), want: withAB, removed: 1},
		{do: writeStep("new.yaml", ""), want: withAB},
	},
}, {
	name: "invalid in place, then renamed to another manifest name: kept under the new name",
	steps: []fileStep{
		{do: writeStep("s.yaml", invalidYAML), want: withAB, failed: 1, failure: "s.yaml"},
		{do: renameStep("s.yaml", "t.yaml"), want: withAB, failed: 1, failure: "t.yaml"},
		{do: writeStep("t.yaml", svcYAML("a", "10.96.0.1")), want: []string{"default/a:http", "default/o:http"}, removed: 1},
	},
}, {
	name: "emptied, then renamed: kept under the new name",
	steps: []fileStep{
		{do: writeStep("s.yaml", ""), want: withAB, failed: 1},
		{do: renameStep("s.yaml", "t.json"), want: withAB, failed: 1, failure: "t.json"},
	},
}, {
	name: "invalid in place, then renamed out of the manifests: removed on purpose",
	steps: []fileStep{
		{do: writeStep("s.yaml", invalidYAML), want: withAB, failed: 1},
		{do: renameStep("s.yaml", "s.yaml.bak"), want: onlyO, removed: 2},
	},
}, {
	name: "valid, renamed: nothing removed",
	steps: []fileStep{
		{do: renameStep("s.yaml", "t.yaml"), want: withAB},
	},
}}

// TestFileSourceEmptiedFileRewritten: a file truncated to nothing and
// written again a moment later, as `kubectl get ... > file` does, never
// hands out a State without its Services, and the hold is logged.
func TestFileSourceEmptiedFileRewritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	write(t, path, twoServices)
	var log syncBuffer
	r := startSource(t, dir, logTo(&log), func(s *FileSource) { s.watch.writeWait = 2 * time.Second })
	r.waitState(t, "default/a:http", "default/b:http")

	write(t, path, "")
	waitLog(t, &log, "level=WARN", path, "empty", "still being written")
	r.noState(t)
	write(t, path, twoServices+svcYAML("c", "10.96.0.3"))
	st := r.waitState(t, "default/a:http", "default/b:http", "default/c:http")
	if got := names(st); len(got) != 3 {
		t.Fatalf("state %v", got)
	}
}

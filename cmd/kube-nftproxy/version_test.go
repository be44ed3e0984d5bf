package main

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/component-base/metrics/legacyregistry"
)

func TestVersionFrom(t *testing.T) {
	info := func(version string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{Main: debug.Module{Version: version}}
			for i := 0; i+1 < len(settings); i += 2 {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	tests := []struct {
		name          string
		rel, com      string
		bi            func() (*debug.BuildInfo, bool)
		wantRel, want string
	}{
		{"stamped", "v1.2.3-4-gabcdef0-dirty", "abcdef0123", info("(devel)", "vcs.revision", "ffff"), "v1.2.3-4-gabcdef0-dirty", "abcdef0123"},
		{"go command's stamp", "", "", info("v0.0.0-20261123114829-9a5bc108c3c4+dirty", "vcs.revision", "9a5bc108c3c4", "vcs.modified", "true"), "v0.0.0-20261123114829-9a5bc108c3c4+dirty", "9a5bc108c3c4-dirty"},
		{"clean revision", "", "", info("(devel)", "vcs.revision", "9a5bc108c3c4", "vcs.modified", "false"), "devel", "9a5bc108c3c4"},
		{"no stamp at all", "", "", info("(devel)"), "devel", "unknown"},
		{"no build info", "", "", none, "devel", "unknown"},
		{"release stamped only", "v2.0.0", "", info("(devel)", "vcs.revision", "beef"), "v2.0.0", "beef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rel, com := versionFrom(tt.rel, tt.com, tt.bi)
			if rel != tt.wantRel || com != tt.want {
				t.Errorf("versionFrom = %q, %q; want %q, %q", rel, com, tt.wantRel, tt.want)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	rel, com := buildVersion()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"version"}, "kube-nftproxy " + rel + " (" + com + ")\n"},
		// kube-proxy prints "Kubernetes v1.37.1": the program and the version.
		{[]string{"--version"}, "kube-nftproxy " + rel + "\n"},
		{[]string{"--version=true"}, "kube-nftproxy " + rel + "\n"},
		{[]string{"--version", "--cluster-cidr", "10.0.0.0/8"}, "kube-nftproxy " + rel + "\n"},
	}
	for _, tt := range tests {
		out, err := run(tt.args...)
		if err != nil || out != tt.want {
			t.Errorf("%v: %q, %v; want %q", tt.args, out, err, tt.want)
		}
	}
	// kube-proxy's --version=raw: version.Info in Go syntax.
	out, err := run("--version=raw")
	for _, part := range []string{`version.Info{Major:"1", Minor:"37", `, `GitVersion:"` + rel + `"`, `GoVersion:"go`, `Platform:"linux/`} {
		if err != nil || !strings.Contains(out, part) {
			t.Errorf("--version=raw: %q, %v; want %s in it", out, err, part)
		}
	}
	if _, err := run("--version=yes"); err == nil || !strings.Contains(err.Error(), `--version "yes"`) {
		t.Errorf("--version=yes: %v, want an error naming it", err)
	}
	// --version=false runs as usual (here: the flag errors of a run).
	if _, err := run("--version=false", "--logging-format=yaml", "--write-config-to", os.DevNull); err == nil || !strings.Contains(err.Error(), "logging.format") {
		t.Errorf("--version=false did not run the command: %v", err)
	}
}

// TestMakeBuildStamps builds the binary as `make build` does and checks that
// `version` and --version print hack/version.sh's release and git's commit: the go command
// stamps nothing in a worktree, so the Makefile must.
func TestMakeBuildStamps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: %v", tool, err)
		}
	}
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			t.Skipf("git %v: %v (not a checkout?)", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	commit := git("rev-parse", "HEAD")
	bin := t.TempDir()
	out, err := exec.Command("make", "-C", "../..", "build", "BIN="+bin).CombinedOutput()
	if err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	// After the build: the tree is dirty or not the same either way.
	out, err = exec.Command("../../hack/version.sh").Output()
	if err != nil {
		t.Fatalf("hack/version.sh: %v", err)
	}
	describe := strings.TrimSpace(string(out))
	for _, tt := range []struct{ arg, want string }{
		{"version", "kube-nftproxy " + describe + " (" + commit + ")\n"},
		{"--version", "kube-nftproxy " + describe + "\n"},
	} {
		got, err := exec.Command(filepath.Join(bin, "kube-nftproxy"), tt.arg).Output()
		if err != nil || string(got) != tt.want {
			t.Errorf("kube-nftproxy %s: %q, %v; want %q", tt.arg, got, err, tt.want)
		}
	}
	// -trimpath: no path of this checkout in the binary.
	wd, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(bin, "kube-nftproxy"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), wd+"/") {
		t.Errorf("the binary holds the checkout's path %s (make build without -trimpath?)", wd)
	}
}

// TestBuildInfoMetric checks kubernetes_build_info as /metrics serves it:
// component-base's labels, major and minor of the kube-proxy release we
// follow, and this build's version and commit.
func TestBuildInfoMetric(t *testing.T) {
	processMetrics()
	fams, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(fams, func(f *dto.MetricFamily) bool { return f.GetName() == "kubernetes_build_info" })
	if i < 0 || len(fams[i].GetMetric()) != 1 {
		t.Fatalf("kubernetes_build_info: not one series in the process-wide registry")
	}
	got := map[string]string{}
	for _, l := range fams[i].GetMetric()[0].GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	rel, com := buildVersion()
	want := map[string]string{"major": "1", "minor": "37", "git_version": rel, "git_commit": strings.TrimSuffix(com, "-dirty"),
		"build_date": "", "compiler": runtime.Compiler, "go_version": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH}
	want["git_tree_state"] = "clean"
	if strings.HasSuffix(com, "-dirty") {
		want["git_tree_state"] = "dirty"
	}
	if !maps.Equal(got, want) {
		t.Errorf("kubernetes_build_info labels %v, want %v", got, want)
	}
	if v := fams[i].GetMetric()[0].GetGauge().GetValue(); v != 1 {
		t.Errorf("kubernetes_build_info = %v, want 1", v)
	}
}

// TestVersionScript runs hack/version.sh in a new repository: before any
// tag, on a tag, after it, and with uncommitted changes; each a semantic
// version, as kube-proxy's git_version.
func TestVersionScript(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skipf("no git: %v", err)
	}
	script, err := os.ReadFile("../../hack/version.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hack", "version.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-C", dir}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := func() string {
		out, err := exec.Command(filepath.Join(dir, "hack", "version.sh")).Output()
		if err != nil {
			t.Fatalf("version.sh: %v", err)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-qm", "one")
	short := git("rev-parse", "--short=12", "HEAD")
	steps := []struct {
		name string
		do   func()
		want string
	}{
		{"no tag", func() {}, "v0.0.0-1-g" + short},
		{"on a tag", func() { git("tag", "v0.1.0") }, "v0.1.0"},
		{"uncommitted change", func() {
			if err := os.WriteFile(filepath.Join(dir, "hack", "version.sh"), append(script, '\n'), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "v0.1.0-dirty"},
	}
	for _, st := range steps {
		st.do()
		if got := version(); got != st.want {
			t.Errorf("%s: %q, want %q", st.name, got, st.want)
		}
		if _, err := utilversion.ParseSemantic(version()); err != nil {
			t.Errorf("%s: %v", st.name, err)
		}
	}
	git("commit", "-qam", "two")
	if got, want := version(), "v0.1.0-1-g"+git("rev-parse", "--short=12", "HEAD"); got != want {
		t.Errorf("a commit after the tag: %q, want %q", got, want)
	}
}

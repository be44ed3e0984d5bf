package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
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
	want := versionLine() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"--version=true"}, {"--version", "--cluster-cidr", "10.0.0.0/8"}} {
		out, err := run(args...)
		if err != nil || out != want {
			t.Errorf("%v: %q, %v; want %q", args, out, err, want)
		}
	}
	out, err := run("--version=raw")
	if err != nil || !strings.Contains(out, "goVersion: go") || !strings.Contains(out, "commit: ") {
		t.Errorf("--version=raw: %q, %v", out, err)
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
// `version` and --version print git's release and commit: the go command
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
	describe := git("describe", "--tags", "--always", "--dirty")
	want := "kube-nftproxy " + describe + " (" + commit + ")\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		got, err := exec.Command(filepath.Join(bin, "kube-nftproxy"), args...).Output()
		if err != nil || string(got) != want {
			t.Errorf("kube-nftproxy %v: %q, %v; want %q", args, got, err, want)
		}
	}
}

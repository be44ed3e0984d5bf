package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPackageLayers checks the rules of docs/architecture.md's package map
// that the map alone does not show, on `go list -deps` (test files left
// out): what a package pulls in transitively.
func TestPackageLayers(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the packages with")
	}
	// kernelFree are the packages that know nothing of the kernel: the
	// model, the loop, the sources and what serves HTTP.
	kernelFree := []string{"model", "proxier", "serve", "iptsave",
		"source/apisource", "source/filesource", "source/kube", "source/manifest"}
	kernelClients := []string{"github.com/mdlayher/netlink", "github.com/vishvananda/netlink",
		"github.com/google/nftables", "internal/nlmsg", "internal/netns", "nftlib", "conntrack", "sysctl"}
	modes := []string{"nft", "ipvs"}
	for _, tc := range []struct {
		pkg       string
		forbidden []string
		why       string
	}{
		{"nftlib", []string{"k8s.io/", "model", "proxier", "nft", "ipvs", "source/"}, "nftlib is a general nftables library: it knows nothing of Kubernetes or of a mode"},
		{"leftover", modes, "removing kube-proxy's leftovers needs no mode"},
		{"migrate", modes, "diff compares facts, not a mode's code"},
		{"nft", []string{"ipvs"}, "the modes are siblings"},
		{"ipvs", []string{"nft"}, "the modes are siblings"},
	} {
		checkDeps(t, goTool, tc.pkg, tc.forbidden, tc.why)
	}
	for _, pkg := range kernelFree {
		checkDeps(t, goTool, pkg, append(kernelClients, modes...), "it is kernel-free")
	}
}

// checkDeps fails when pkg depends, directly or not, on a package named by
// forbidden: a path of the module relative to it (a prefix when it ends in
// "/"), or a full import path.
func checkDeps(t *testing.T, goTool, pkg string, forbidden []string, why string) {
	t.Helper()
	cmd := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", "./"+pkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./%s: %v", pkg, err)
	}
	for dep := range strings.Lines(string(out)) {
		dep = strings.TrimSpace(dep)
		for _, f := range forbidden {
			if dependsOn(dep, f) {
				t.Errorf("%s depends on %s, but %s", pkg, dep, why)
			}
		}
	}
}

// dependsOn tells whether the import path dep is the forbidden package f:
// a path of the module relative to it, or a full import path (with a dot);
// either names its subpackages too, and one ending in "/" only them.
func dependsOn(dep, f string) bool {
	if !strings.Contains(strings.Split(f, "/")[0], ".") {
		own, ok := strings.CutPrefix(dep, "github.com/kube-nftproxy/kube-nftproxy/")
		if !ok {
			return false
		}
		dep = own
	}
	return dep == f || strings.HasPrefix(dep, strings.TrimSuffix(f, "/")+"/")
}

func TestDependsOn(t *testing.T) {
	const own = "github.com/kube-nftproxy/kube-nftproxy/"
	for _, tc := range []struct {
		dep, f string
		want   bool
	}{
		{own + "nft", "nft", true},
		{own + "nftlib", "nft", false},
		{own + "nftlocal", "nft", false},
		{own + "source/kube", "source/", true},
		{own + "internal/nlmsg", "internal/nlmsg", true},
		{"k8s.io/api/core/v1", "k8s.io/", true},
		{"github.com/mdlayher/netlink/nlenc", "github.com/mdlayher/netlink", true},
		{"github.com/mdlayher/netlinkx", "github.com/mdlayher/netlink", false},
		{"example.com/nft", "nft", false},
	} {
		if got := dependsOn(tc.dep, tc.f); got != tc.want {
			t.Errorf("dependsOn(%q, %q) = %v, want %v", tc.dep, tc.f, got, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestBuiltImagesRunTheirTools checks the archives images.sh wrote into
// $KNP_CACHE/cluster/images: each image's file system, flattened, runs the
// commands its users exec (chroot, in a network namespace of its own).
// Images not built yet are skipped.
func TestBuiltImagesRunTheirTools(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot, unshare)")
	}
	cache := os.Getenv("KNP_CACHE")
	if cache == "" {
		cache = "/var/cache/kube-nftproxy"
	}
	dir := filepath.Join(cache, "cluster", "images")
	const tools = "wget curl nc dig ip ss iperf socat ping getent"
	const xtables = "iptables --version && ip6tables --version && nft --version && conntrack --version"
	tests := []struct {
		archive string
		argv    []string // run with chroot
		want    string   // in the combined output
	}{
		{"pause.tar", []string{"/pause", "-v"}, "pause.c v3.10.2"},
		{"kube-nftproxy.tar", []string{"/kube-nftproxy", "version"}, ""},
		{"busybox.tar", sh("command -v nc wget sleep && echo ok"), "ok"},
		{"agnhost.tar", sh("for c in " + tools + "; do command -v $c; done && wget --version | head -1 && " +
			"/coredns -version && test -d /uploads && /agnhost-2 --help >/dev/null && id user-defined-in-image"),
			"group-defined-in-image"},
		{"agnhost.tar", sh("wget --version | head -1"), "GNU Wget"},
		{"agnhost.tar", sh(registryCheck), "pulled pause:testing"},
		{"glibc-dns-testing.tar", sh("dig -v 2>&1 && /coredns -version"), "CoreDNS-"},
		{"coredns.tar", []string{"/coredns", "-version"}, "CoreDNS-"},
		{"distroless-iptables.tar", sh(xtables + " && command -v sleep"), "conntrack v"},
		{"kube-proxy.tar", sh(xtables + " && /usr/local/bin/kube-proxy --version"), "Kubernetes v1.37.1"},
		{"nginx.tar", sh("nginx -t -e stderr 2>&1"), "test is successful"},
		{"regression-issue-74839.tar", sh("test -x /regression-issue-74839 && echo ok"), "ok"},
		{"flannel.tar", sh("/opt/bin/flanneld --version 2>&1 && iptables --version && test -x /opt/bin/install-conf"), "(nf_tables)"},
		{"flannel-cni-plugin.tar", sh("cp -f /flannel /tmp/flannel && echo copied"), "copied"},
	}
	for _, tt := range tests {
		t.Run(tt.archive, func(t *testing.T) {
			archive := filepath.Join(dir, tt.archive)
			if _, err := os.Stat(archive); err != nil {
				t.Skipf("%s not built (hack/cluster/images.sh)", archive)
			}
			root := flatten(t, archive)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args := append([]string{"--net", "chroot", root}, tt.argv...)
			out, err := exec.CommandContext(ctx, "unshare", args...).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tt.want) {
				t.Fatalf("%s in %s: err %v, want %q in output:\n%s", tt.argv, tt.archive, err, tt.want, out)
			}
			t.Logf("%s", bytes.TrimSpace(out))
		})
	}
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

// flatten extracts an archive's image (its layers applied in order, as a
// container's root) into a temporary directory.
func flatten(t *testing.T, archive string) string {
	t.Helper()
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", "knp-images-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	rc := mutate.Extract(img)
	defer rc.Close()
	cmd := exec.Command("tar", "-x", "--numeric-owner", "-C", root)
	cmd.Stdin = rc
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("extract %s: %v\n%s", archive, err, stderr.Bytes())
	}
	io.Copy(io.Discard, rc)
	return root
}

// registryCheck pulls pause:testing from agnhost's fake-registry-server
// (private, as the LocalhostNodePorts spec runs it) the way a registry
// client does: the tag redirects to the index, the index names the linux
// image's manifest, which names the config and layers; every object's
// sha256 must be its digest. It polls the server for up to 10 s.
const registryCheck = `set -e
ip link set lo up
/agnhost fake-registry-server --private --port 5000 >/tmp/registry.log 2>&1 &
get() { curl -sfL -u user:password -o "$2" -w '%{content_type}\n' "localhost:5000/v2/pause/$1"; }
verify() { test "$(sha256sum "$2" | cut -d' ' -f1)" = "${1#sha256:}" || { echo "digest mismatch: $1"; exit 1; }; }
i=0
until curl -sf -u user:password localhost:5000/v2/ >/dev/null; do
	i=$((i+1)); test $i -lt 100 || { cat /tmp/registry.log; exit 1; }; sleep 0.1
done
test "$(curl -s -o /dev/null -w '%{http_code}' localhost:5000/v2/)" = 401
get manifests/testing /tmp/index
idx=$(curl -sf -u user:password -o /dev/null -w '%{url_effective}' -L localhost:5000/v2/pause/manifests/testing)
verify "${idx##*/}" /tmp/index
m=$(grep -o '"digest":"sha256:[0-9a-f]*"' /tmp/index | head -1 | cut -d'"' -f4)
get "manifests/$m" /tmp/manifest
verify "$m" /tmp/manifest
for d in $(grep -o '"digest":"sha256:[0-9a-f]*"' /tmp/manifest | cut -d'"' -f4); do
	get "blobs/$d" /tmp/blob >/dev/null
	verify "$d" /tmp/blob
	echo "blob $d"
done
echo pulled pause:testing`

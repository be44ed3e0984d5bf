package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

const testEpoch = 1764000000 // a commit's time

// ociImage writes a fake binary per platform under dir and returns the
// build flags of a two-platform OCI archive of them, as hack/image.sh's.
func ociImage(t *testing.T, dir, out string) []string {
	t.Helper()
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(dir, "linux-"+arch, "kube-nftproxy")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("binary for "+arch), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"build", "-format", "oci", "-out", out, "-ref", "kube-nftproxy:v0.1.0",
		"-platform", "linux/amd64", "-platform", "linux/arm64", "-epoch", "1764000000",
		"-file", "/kube-nftproxy=" + filepath.Join(dir, "{os}-{arch}", "kube-nftproxy"),
		"-symlink", "/usr/local/bin/kube-proxy=/kube-nftproxy", "-entrypoint", `["/kube-nftproxy"]`,
		"-label", "org.opencontainers.image.version=v0.1.0", "-label", "org.opencontainers.image.licenses=Apache-2.0"}
}

// TestOCIArchiveIsReproducible builds the archive twice from the same
// inputs, in two directories at two times: the same bytes. A changed
// input changes the digest.
func TestOCIArchiveIsReproducible(t *testing.T) {
	tests := []struct {
		name     string
		change   func(args []string) []string
		wantSame bool
	}{
		{"same inputs", func(a []string) []string { return a }, true},
		{"other epoch", func(a []string) []string { return replaceArg(a, "1764000000", "1764000001") }, false},
		{"other label", func(a []string) []string {
			return replaceArg(a, "org.opencontainers.image.version=v0.1.0", "org.opencontainers.image.version=v0.1.1")
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var digests []string
			var archives [][]byte
			for i, change := range []func([]string) []string{func(a []string) []string { return a }, tt.change} {
				dir := t.TempDir()
				out := filepath.Join(dir, "image.tar")
				if err := run(change(ociImage(t, dir, out)), io.Discard, io.Discard); err != nil {
					t.Fatalf("build %d: %v", i, err)
				}
				d, err := archiveIndexDigest(out)
				if err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				digests, archives = append(digests, d), append(archives, b)
			}
			if same := digests[0] == digests[1]; same != tt.wantSame {
				t.Fatalf("digests %v: same = %v, want %v", digests, same, tt.wantSame)
			}
			if tt.wantSame && !bytes.Equal(archives[0], archives[1]) {
				t.Fatal("the same index digest but different archive bytes")
			}
		})
	}
}

func replaceArg(args []string, old, new string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == old {
			out[i] = new
		}
	}
	return out
}

// TestOCIArchiveContent reads the archive back as an OCI layout: one
// index named kube-nftproxy:v0.1.0, both platforms, each with its own
// binary, the symlink, the labels, and the epoch as created and mtime.
func TestOCIArchiveContent(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "image.tar")
	if err := run(ociImage(t, dir, out), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	top, err := readArchiveIndex(out)
	if err != nil {
		t.Fatal(err)
	}
	wantNames := map[string]string{annotationRefName: "v0.1.0", annotationImageName: "docker.io/library/kube-nftproxy:v0.1.0"}
	if len(top.Manifests) != 1 || !reflect.DeepEqual(top.Manifests[0].Annotations, wantNames) {
		t.Fatalf("index.json = %+v, want one index annotated %v", top, wantNames)
	}
	root := filepath.Join(dir, "layout")
	untar(t, out, root)
	idx, err := layout.ImageIndexFromPath(root)
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := img.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.Annotations["org.opencontainers.image.version"] != "v0.1.0" || im.Annotations[annotationCreated] != "2025-11-24T16:00:00Z" {
		t.Errorf("index annotations = %v", im.Annotations)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.String())
		image, err := img.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := image.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		wantLabels := map[string]string{"org.opencontainers.image.version": "v0.1.0", "org.opencontainers.image.licenses": "Apache-2.0"}
		if !reflect.DeepEqual(cf.Config.Labels, wantLabels) || !cf.Created.Equal(time.Unix(testEpoch, 0)) ||
			!reflect.DeepEqual(cf.Config.Entrypoint, []string{"/kube-nftproxy"}) || cf.Architecture != m.Platform.Architecture {
			t.Errorf("%s config: labels %v created %v entrypoint %v arch %s", m.Platform, cf.Config.Labels, cf.Created,
				cf.Config.Entrypoint, cf.Architecture)
		}
		layers, err := image.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s layers: %v, %v", m.Platform, layers, err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		got := tarListingAt(t, rc, time.Unix(testEpoch, 0))
		rc.Close()
		want := []string{"usr/ dir 755", "usr/local/ dir 755", "usr/local/bin/ dir 755", "kube-nftproxy file 755",
			"usr/local/bin/kube-proxy symlink /kube-nftproxy"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s layer:\n got %q\nwant %q", m.Platform, got, want)
		}
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !reflect.DeepEqual(platforms, want) {
		t.Errorf("platforms = %v, want %v", platforms, want)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xf", archive, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v: %s", err, out)
	}
}

// TestTagKeepsTheIndex: a retagged archive has the same image index and
// only the new names.
func TestTagKeepsTheIndex(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "image.tar")
	if err := run(ociImage(t, dir, out), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	tagged := filepath.Join(dir, "cluster.tar")
	if err := run([]string{"tag", "-in", out, "-out", tagged, "-ref", "registry.local/kube-nftproxy:v0.1.0",
		"-ref", "docker.io/library/kube-nftproxy:dev"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	a, _ := readArchiveIndex(out)
	b, err := readArchiveIndex(tagged)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range b.Manifests {
		if m.Digest != a.Manifests[0].Digest {
			t.Errorf("retagged %s, want %s", m.Digest, a.Manifests[0].Digest)
		}
		names = append(names, m.Annotations[annotationImageName])
	}
	if want := []string{"registry.local/kube-nftproxy:v0.1.0", "docker.io/library/kube-nftproxy:dev"}; !reflect.DeepEqual(names, want) {
		t.Errorf("names = %v, want %v", names, want)
	}
}

// TestCtrImportsTheOCIArchive imports the two-platform archive into a
// private containerd as a node does, and as README.md tells users to (all
// platforms): the name docker.io/library/kube-nftproxy:v0.1.0, both
// platforms listed, every blob in the content store.
func TestCtrImportsTheOCIArchive(t *testing.T) {
	containerd, ctr, dir := containerdTestDir(t, "knp-images-oci-")
	out := filepath.Join(dir, "image.tar")
	if err := run(ociImage(t, dir, out), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	ctrRun := privateCtr(t, containerd, ctr, dir)
	ctrRun("images", "import", "--all-platforms", out)
	listed := ctrRun("images", "ls")
	if !strings.Contains(listed, "docker.io/library/kube-nftproxy:v0.1.0 ") || !strings.Contains(listed, "linux/amd64,linux/arm64") {
		t.Errorf("images ls after import:\n%s", listed)
	}
	digest, err := archiveIndexDigest(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(listed, digest) {
		t.Errorf("images ls does not show the index %s:\n%s", digest, listed)
	}
	// Every blob of the archive (index, 2 manifests, 2 configs, 2 layers;
	// the import adds index.json itself).
	content := ctrRun("content", "ls", "-q")
	untar(t, out, filepath.Join(dir, "layout"))
	blobs, err := filepath.Glob(filepath.Join(dir, "layout", "blobs", "sha256", "*"))
	if err != nil || len(blobs) != 7 {
		t.Fatalf("archive blobs %v, %v: want 7", blobs, err)
	}
	for _, b := range blobs {
		if !strings.Contains(content, "sha256:"+filepath.Base(b)) {
			t.Errorf("content ls lacks %s:\n%s", filepath.Base(b), content)
		}
	}
	t.Logf("ctr images ls:\n%s", listed)
}

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestParseSpec(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		layer   bool
		wantErr string
	}{
		{name: "minimal", args: []string{"-out", "x.tar", "-ref", "registry.k8s.io/pause:3.10.2"}},
		{name: "no out", args: []string{"-ref", "a/b:c"}, wantErr: "-out is required"},
		{name: "no ref", args: []string{"-out", "x.tar"}, wantErr: "at least one -ref"},
		{name: "bad env", args: []string{"-out", "x", "-ref", "a/b:c", "-env", "PATH"}, wantErr: "want KEY=VALUE"},
		{name: "bad entrypoint", args: []string{"-out", "x", "-ref", "a/b:c", "-entrypoint", "/pause"}, wantErr: "JSON array"},
		{name: "relative path", args: []string{"-out", "x", "-ref", "a/b:c", "-file", "pause=/bin/true"}, wantErr: "must be absolute"},
		{name: "dot-dot path", args: []string{"-out", "x", "-ref", "a/b:c", "-dir", "/a/../etc"}, wantErr: "must be absolute"},
		{name: "file without source", args: []string{"-out", "x", "-ref", "a/b:c", "-file", "/pause"}, wantErr: "want PATH=SOURCE"},
		{name: "bad dir mode", args: []string{"-out", "x", "-ref", "a/b:c", "-dir", "/tmp:rwx"}, wantErr: "not octal"},
		{name: "bad platform", args: []string{"-out", "x", "-ref", "a/b:c", "-platform", "linux"}, wantErr: "want os/arch"},
		{name: "extra argument", args: []string{"-out", "x", "-ref", "a/b:c", "extra"}, wantErr: "unexpected arguments"},
		{name: "layer", args: []string{"-out", "l.tar.gz", "-dir", "/tmp:1777"}, layer: true},
		{name: "layer with config", args: []string{"-out", "l", "-dir", "/x", "-user", "1"}, layer: true, wantErr: "layer takes only"},
		{name: "empty layer", args: []string{"-out", "l"}, layer: true, wantErr: "at least one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseSpec(tt.args, tt.layer, io.Discard)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("parseSpec: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parseSpec error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// smallImage writes a host file and returns the flags of an image using it.
func smallImage(t *testing.T, dir string) (out string, args []string) {
	t.Helper()
	bin := filepath.Join(dir, "hello")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(dir, "hello.tar")
	return out, []string{"build", "-out", out,
		"-ref", "registry.k8s.io/e2e-test-images/hello:1.0", "-ref", "docker.io/library/hello:dev",
		"-file", "/opt/bin/hello=" + bin, "-symlink", "/hello=opt/bin/hello", "-dir", "/uploads",
		"-dir", "/scratch:1777", "-entrypoint", `["/opt/bin/hello"]`, "-cmd", `["pause"]`,
		"-user", "1000:50000", "-workdir", "/uploads", "-env", "PATH=/usr/bin:/bin",
		"-expose", "8080", "-expose", "53/udp", "-stopsignal", "SIGQUIT"}
}

func TestBuildWritesConfigTagsAndLayer(t *testing.T) {
	out, args := smallImage(t, t.TempDir())
	if err := run(args, io.Discard, io.Discard); err != nil {
		t.Fatalf("build: %v", err)
	}
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	wantTags := []string{"docker.io/library/hello:dev", "registry.k8s.io/e2e-test-images/hello:1.0"}
	if len(manifest) == 1 {
		slices.Sort(manifest[0].RepoTags) // written from a map
	}
	if len(manifest) != 1 || !reflect.DeepEqual(manifest[0].RepoTags, wantTags) {
		t.Fatalf("manifest = %+v, want one image tagged %v (references kept as written: "+
			"docker.io must not become index.docker.io)", manifest, wantTags)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	checks := []struct {
		what      string
		got, want any
	}{
		{"os/arch", cf.OS + "/" + cf.Architecture, "linux/amd64"},
		{"entrypoint", c.Entrypoint, []string{"/opt/bin/hello"}},
		{"cmd", c.Cmd, []string{"pause"}},
		{"user", c.User, "1000:50000"},
		{"workdir", c.WorkingDir, "/uploads"},
		{"env", c.Env, []string{"PATH=/usr/bin:/bin"}},
		{"exposed", c.ExposedPorts, map[string]struct{}{"8080/tcp": {}, "53/udp": {}}},
		{"stop signal", c.StopSignal, "SIGQUIT"},
		{"diff ids", len(cf.RootFS.DiffIDs), 1},
	}
	for _, ch := range checks {
		if !reflect.DeepEqual(ch.got, ch.want) {
			t.Errorf("%s = %v, want %v", ch.what, ch.got, ch.want)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := tarListing(t, rc)
	want := []string{"opt/ dir 755", "opt/bin/ dir 755", "opt/bin/hello file 755", "hello symlink opt/bin/hello",
		"uploads/ dir 755", "scratch/ dir 1777"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer entries:\n got %q\nwant %q", got, want)
	}
}

// tarListing lists a tarball as "name type mode-or-target" lines.
func tarListing(t *testing.T, r io.Reader) []string {
	t.Helper()
	return tarListingAt(t, r, time.Unix(0, 0))
}

// tarListingAt is tarListing of a layer whose entries are dated mtime.
func tarListingAt(t *testing.T, r io.Reader, mtime time.Time) []string {
	t.Helper()
	var list []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return list
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(mtime) {
			t.Errorf("%s: owner %d:%d mtime %v, want root and the fixed mtime", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			list = append(list, h.Name+" dir "+octal(h.Mode))
		case tar.TypeSymlink:
			list = append(list, h.Name+" symlink "+h.Linkname)
		default:
			list = append(list, h.Name+" file "+octal(h.Mode))
		}
	}
}

func octal(m int64) string { return strconv.FormatInt(m, 8) }

func TestBuildIsCachedUntilAnInputChanges(t *testing.T) {
	dir := t.TempDir()
	out, args := smallImage(t, dir)
	steps := []struct {
		name   string
		change func()
		want   string
	}{
		{"first build", func() {}, "built"},
		{"unchanged", func() {}, "cached"},
		{"input file changed", func() {
			os.WriteFile(filepath.Join(dir, "hello"), []byte("#!/bin/sh\necho bye\n"), 0o755)
		}, "built"},
		{"unchanged again", func() {}, "cached"},
		{"archive deleted", func() { os.Remove(out) }, "built"},
		{"config changed", func() { args = append(args, "-env", "A=B") }, "built"},
	}
	for _, s := range steps {
		s.change()
		var stdout bytes.Buffer
		if err := run(args, &stdout, io.Discard); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !strings.HasPrefix(stdout.String(), s.want) {
			t.Errorf("%s: output %q, want %s", s.name, stdout.String(), s.want)
		}
	}
}

// TestLayerIsReproducible: a shared layer generated twice has the same
// bytes, so images built from it at different times share its digest.
func TestLayerIsReproducible(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	for _, d := range []string{"bin", "tmp"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(tree, "tmp"), 0o1777|os.ModeSticky)
	os.WriteFile(filepath.Join(tree, "bin", "busybox"), []byte("binary"), 0o755)
	os.Symlink("busybox", filepath.Join(tree, "bin", "sh"))
	var layers [][]byte
	for i := range 2 {
		out := filepath.Join(dir, "layer"+string(rune('a'+i))+".tar.gz")
		if err := run([]string{"layer", "-out", out, "-tree", "/=" + tree}, io.Discard, io.Discard); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, b)
	}
	if !bytes.Equal(layers[0], layers[1]) {
		t.Fatal("the same tree gave two different layers")
	}
	zr, err := gzip.NewReader(bytes.NewReader(layers[0]))
	if err != nil {
		t.Fatal(err)
	}
	got := tarListing(t, zr)
	want := []string{"bin/ dir 755", "bin/busybox file 755", "bin/sh symlink busybox", "tmp/ dir 1777"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tree layer:\n got %q\nwant %q", got, want)
	}
}

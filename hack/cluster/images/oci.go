package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The annotations that name an image in an OCI layout's index.json: the
// OCI one holds the tag alone (as the image-layout spec suggests), the
// containerd one the whole normalized reference, which `ctr images import`,
// Docker's containerd image store and podman load take as the image's name.
const (
	annotationRefName   = "org.opencontainers.image.ref.name"
	annotationImageName = "io.containerd.image.name"
	annotationCreated   = "org.opencontainers.image.created"
)

// ociLayout is the archive's oci-layout file.
const ociLayout = `{"imageLayoutVersion":"1.0.0"}`

// buildOCI writes spec.Out as an OCI image layout archive: one image per
// platform in one image index, index.json naming it by every reference,
// and a manifest.json naming the first platform's image for docker load
// with Docker's classic store. It returns the image index's digest.
func buildOCI(spec imageSpec) (string, error) {
	idx, first, err := assembleIndex(spec)
	if err != nil {
		return "", err
	}
	digest, err := idx.Digest()
	if err != nil {
		return "", err
	}
	a, err := newOCIArchive(idx, first, spec.Refs)
	if err != nil {
		return "", err
	}
	if err := a.writeFile(spec.Out, spec.mtime()); err != nil {
		return "", err
	}
	return digest.String(), nil
}

// assembleIndex builds each platform's image and the index of them, with
// the labels (and the created time) as the index's annotations.
func assembleIndex(spec imageSpec) (v1.ImageIndex, v1.Image, error) {
	var adds []mutate.IndexAddendum
	var first v1.Image
	for _, p := range spec.Platforms {
		img, err := assemble(spec, p)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, nil, fmt.Errorf("platform %q: %w", p, err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
		if first == nil {
			first = img
		}
	}
	idx := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, adds...), types.OCIImageIndex)
	anns := labelMap(spec.Labels)
	if spec.Epoch != 0 {
		anns[annotationCreated] = spec.mtime().Format(time.RFC3339)
	}
	if len(anns) > 0 {
		idx = mutate.Annotations(idx, anns).(v1.ImageIndex)
	}
	return idx, first, nil
}

// ociArchive is the content of an OCI layout archive: its blobs by digest
// and its top-level files.
type ociArchive struct {
	blobs map[string][]byte // hex digest -> content (manifests, configs, index)
	// layers are read from their files when written, not held in memory.
	layers map[string]v1.Layer
	files  map[string][]byte // index.json, oci-layout, manifest.json
}

func newOCIArchive(idx v1.ImageIndex, first v1.Image, refs []string) (*ociArchive, error) {
	a := &ociArchive{blobs: map[string][]byte{}, layers: map[string]v1.Layer{}, files: map[string][]byte{}}
	if err := a.addIndex(idx); err != nil {
		return nil, err
	}
	desc, err := indexDescriptor(idx)
	if err != nil {
		return nil, err
	}
	if a.files["index.json"], err = topIndex(desc, refs); err != nil {
		return nil, err
	}
	if a.files["manifest.json"], err = dockerManifest(first, refs); err != nil {
		return nil, err
	}
	a.files["oci-layout"] = []byte(ociLayout)
	return a, nil
}

// addIndex records the index, and each image's manifest, config and layers.
func (a *ociArchive) addIndex(idx v1.ImageIndex) error {
	if err := a.addManifest(idx); err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			return err
		}
		if err := a.addImage(img); err != nil {
			return err
		}
	}
	return nil
}

// manifested is an index or an image: a manifest stored under its digest.
type manifested interface {
	RawManifest() ([]byte, error)
	Digest() (v1.Hash, error)
}

// addManifest records m's manifest as a blob named by its digest.
func (a *ociArchive) addManifest(m manifested) error {
	raw, err := m.RawManifest()
	if err != nil {
		return err
	}
	d, err := m.Digest()
	if err != nil {
		return err
	}
	a.blobs[d.Hex] = raw
	return nil
}

// addImage records an image's manifest, config and layers.
func (a *ociArchive) addImage(img v1.Image) error {
	if err := a.addManifest(img); err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cd, err := img.ConfigName()
	if err != nil {
		return err
	}
	a.blobs[cd.Hex] = cfg
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return err
		}
		a.layers[ld.Hex] = l
	}
	return nil
}

func indexDescriptor(idx v1.ImageIndex) (v1.Descriptor, error) {
	raw, err := idx.RawManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	d, err := idx.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	return v1.Descriptor{MediaType: types.OCIImageIndex, Size: int64(len(raw)), Digest: d}, nil
}

// topIndex is index.json: the image index once per reference, each named
// by its tag (OCI) and its whole normalized reference (containerd).
func topIndex(desc v1.Descriptor, refs []string) ([]byte, error) {
	top := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, r := range refs {
		full, tag, err := normalizeRef(r)
		if err != nil {
			return nil, err
		}
		d := desc
		d.Annotations = map[string]string{annotationRefName: tag, annotationImageName: full}
		top.Manifests = append(top.Manifests, d)
	}
	return json.Marshal(top)
}

// dockerManifest is manifest.json: docker load's list of images, here the
// first platform's, tagged with every reference in Docker's short form.
func dockerManifest(img v1.Image, refs []string) ([]byte, error) {
	cd, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	entry := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: blobPath(cd)}
	for _, l := range m.Layers {
		entry.Layers = append(entry.Layers, blobPath(l.Digest))
	}
	for _, r := range refs {
		full, _, err := normalizeRef(r)
		if err != nil {
			return nil, err
		}
		entry.RepoTags = append(entry.RepoTags, familiarRef(full))
	}
	return json.Marshal([]any{entry})
}

func blobPath(d v1.Hash) string { return "blobs/" + d.Algorithm + "/" + d.Hex }

// normalizeRef returns a tagged reference in the form containerd and the
// kubelet store it (docker.io/library/NAME:TAG for a bare NAME:TAG) and
// its tag.
func normalizeRef(ref string) (full, tag string, err error) {
	t, err := name.NewTag(ref)
	if err != nil {
		return "", "", fmt.Errorf("reference %q: %w", ref, err)
	}
	if i := strings.LastIndex(ref, ":"); i < strings.LastIndex(ref, "/") || i < 0 {
		return "", "", fmt.Errorf("reference %q: want a tag", ref)
	}
	registry := t.RegistryStr()
	if registry == name.DefaultRegistry {
		registry = "docker.io"
	}
	return registry + "/" + t.RepositoryStr() + ":" + t.TagStr(), t.TagStr(), nil
}

// familiarRef is a normalized reference as Docker prints it.
func familiarRef(full string) string {
	if s, ok := strings.CutPrefix(full, "docker.io/library/"); ok {
		return s
	}
	return strings.TrimPrefix(full, "docker.io/")
}

// writeFile writes the archive under a temporary name and renames it. Its
// entries are sorted, owned by root, with mtime: the same content always
// gives the same bytes.
func (a *ociArchive) writeFile(out string, mtime time.Time) (err error) {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("create archive: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	err = a.writeEntries(tw, mtime)
	for _, closeErr := range []error{tw.Close(), bw.Flush(), f.Close()} {
		if err == nil {
			err = closeErr
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

func (a *ociArchive) writeEntries(tw *tar.Writer, mtime time.Time) error {
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	var hexes []string
	for h := range a.blobs {
		hexes = append(hexes, h)
	}
	for h := range a.layers {
		hexes = append(hexes, h)
	}
	sort.Strings(hexes)
	for _, h := range hexes {
		if err := a.writeBlob(tw, h, mtime); err != nil {
			return err
		}
	}
	for _, n := range []string{"index.json", "manifest.json", "oci-layout"} {
		if err := writeTarFile(tw, n, int64(len(a.files[n])), strings.NewReader(string(a.files[n])), mtime); err != nil {
			return err
		}
	}
	return nil
}

func (a *ociArchive) writeBlob(tw *tar.Writer, hex string, mtime time.Time) error {
	p := "blobs/sha256/" + hex
	if b, ok := a.blobs[hex]; ok {
		return writeTarFile(tw, p, int64(len(b)), strings.NewReader(string(b)), mtime)
	}
	l := a.layers[hex]
	size, err := l.Size()
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	return writeTarFile(tw, p, size, rc, mtime)
}

func writeTarFile(tw *tar.Writer, p string, size int64, r io.Reader, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Size: size, Mode: 0o644, ModTime: mtime}); err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != size {
		return fmt.Errorf("%s: wrote %d bytes, want %d", p, n, size)
	}
	return nil
}

// archiveIndexDigest reads an OCI layout archive's index.json and returns
// the digest of the image index it names.
func archiveIndexDigest(archive string) (string, error) {
	top, err := readArchiveIndex(archive)
	if err != nil {
		return "", err
	}
	if len(top.Manifests) == 0 {
		return "", fmt.Errorf("%s: index.json names no image", archive)
	}
	return top.Manifests[0].Digest.String(), nil
}

func readArchiveIndex(archive string) (*v1.IndexManifest, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: no index.json (not an OCI layout archive)", archive)
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", archive, err)
		}
		if h.Name == "index.json" {
			return v1.ParseIndexManifest(tr)
		}
	}
}

// retag writes out as a copy of the OCI layout archive in, every blob as
// it is (the same image index, the same digest), named by refs instead.
func retag(in, out string, refs []string) error {
	top, err := readArchiveIndex(in)
	if err != nil {
		return err
	}
	if len(top.Manifests) == 0 {
		return fmt.Errorf("%s: index.json names no image", in)
	}
	desc := top.Manifests[0]
	desc.Annotations = nil
	index, err := topIndex(desc, refs)
	if err != nil {
		return err
	}
	src, err := os.Open(in)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := out + ".tmp"
	dst, err := os.Create(tmp)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(dst, 1<<20)
	tw := tar.NewWriter(bw)
	err = copyRetagged(tar.NewReader(bufio.NewReader(src)), tw, index, refs)
	for _, closeErr := range []error{tw.Close(), bw.Flush(), dst.Close()} {
		if err == nil {
			err = closeErr
		}
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("retag %s: %w", in, err)
	}
	return os.Rename(tmp, out)
}

// copyRetagged copies every entry, index.json replaced by index and
// manifest.json's RepoTags by refs.
func copyRetagged(tr *tar.Reader, tw *tar.Writer, index []byte, refs []string) error {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var body io.Reader = tr
		switch h.Name {
		case "index.json":
			body = strings.NewReader(string(index))
			h.Size = int64(len(index))
		case "manifest.json":
			b, err := retagDockerManifest(tr, refs)
			if err != nil {
				return err
			}
			body = strings.NewReader(string(b))
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, body); err != nil {
			return err
		}
	}
}

func retagDockerManifest(r io.Reader, refs []string) ([]byte, error) {
	var entries []map[string]any
	if err := json.NewDecoder(r).Decode(&entries); err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	var tags []string
	for _, ref := range refs {
		full, _, err := normalizeRef(ref)
		if err != nil {
			return nil, err
		}
		tags = append(tags, familiarRef(full))
	}
	for i, e := range entries {
		e["RepoTags"] = []string(nil)
		if i == 0 {
			e["RepoTags"] = tags
		}
	}
	return json.Marshal(entries)
}

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// stampVersion changes whenever the way images are assembled changes, so
// archives written by an older tool are rebuilt.
const stampVersion = "cluster-images/2"

// buildResult says whether an archive was written or found up to date.
type buildResult struct {
	Cached bool
	Digest string // docker: the image's config digest (its image ID); oci: the image index's digest
}

// build writes spec.Out unless it exists and its stamp (a hash of the spec
// and of every input file's content) is unchanged.
func build(spec imageSpec) (buildResult, error) {
	stamp, err := inputHash(spec)
	if err != nil {
		return buildResult{}, err
	}
	stampFile := spec.Out + ".stamp"
	if upToDate(spec.Out, stampFile, stamp) {
		res := buildResult{Cached: true}
		if spec.Format == formatOCI {
			res.Digest, err = archiveIndexDigest(spec.Out)
		}
		return res, err
	}
	defer removeLayerTemps(spec)
	var digest string
	if spec.Format == formatOCI {
		digest, err = buildOCI(spec)
	} else {
		digest, err = buildDocker(spec)
	}
	if err != nil {
		return buildResult{}, err
	}
	if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
		return buildResult{}, fmt.Errorf("write stamp: %w", err)
	}
	return buildResult{Digest: digest}, nil
}

// buildDocker writes spec.Out as a docker archive of its one platform's
// image and returns the image's ID.
func buildDocker(spec imageSpec) (string, error) {
	img, err := assemble(spec, spec.Platforms[0])
	if err != nil {
		return "", err
	}
	if err := writeArchive(spec, img); err != nil {
		return "", err
	}
	id, err := img.ConfigName()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// buildLayer writes spec.Out as a layer tarball of spec.Entries unless its
// stamp is unchanged; it reports whether it was.
func buildLayer(spec imageSpec) (cached bool, err error) {
	stamp, err := inputHash(spec)
	if err != nil {
		return false, err
	}
	stampFile := spec.Out + ".stamp"
	if upToDate(spec.Out, stampFile, stamp) {
		return true, nil
	}
	tmp := spec.Out + ".tmp"
	if err := writeLayer(tmp, spec.Entries, spec.mtime()); err != nil {
		os.Remove(tmp)
		return false, err
	}
	if err := os.Rename(tmp, spec.Out); err != nil {
		return false, fmt.Errorf("rename layer: %w", err)
	}
	if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
		return false, fmt.Errorf("write stamp: %w", err)
	}
	return false, nil
}

// upToDate reports whether out exists and its stamp file holds stamp.
func upToDate(out, stampFile, stamp string) bool {
	old, err := os.ReadFile(stampFile)
	if err != nil || strings.TrimSpace(string(old)) != stamp {
		return false
	}
	_, err = os.Stat(out)
	return err == nil
}

// assemble stacks the prebuilt layers and the generated one (its entries'
// sources expanded for platform) on an empty image and sets the config.
func assemble(spec imageSpec, platform string) (v1.Image, error) {
	oci := spec.Format == formatOCI
	var layerOpts []tarball.LayerOption
	base := empty.Image
	if oci {
		layerOpts = append(layerOpts, tarball.WithMediaType(types.OCILayer))
		base = mutate.ConfigMediaType(mutate.MediaType(base, types.OCIManifestSchema1), types.OCIConfigJSON)
	}
	var layers []v1.Layer
	for _, p := range spec.Layers {
		l, err := tarball.LayerFromFile(p, layerOpts...)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", p, err)
		}
		layers = append(layers, l)
	}
	if len(spec.Entries) > 0 {
		tmp := layerTemp(spec, platform)
		if err := writeLayer(tmp, expandEntries(spec.Entries, platform), spec.mtime()); err != nil {
			return nil, err
		}
		// The layer is read again when the archive is written; it is removed
		// after that (removeLayerTemps).
		l, err := tarball.LayerFromFile(tmp, layerOpts...)
		if err != nil {
			return nil, fmt.Errorf("generated layer: %w", err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, _ = strings.Cut(platform, "/")
	cf.Config = containerConfig(spec)
	if spec.Epoch != 0 {
		created := v1.Time{Time: spec.mtime()}
		cf.Created = created
		for i := range cf.History {
			cf.History[i].Created = created
		}
	}
	return mutate.ConfigFile(img, cf)
}

// layerTemp is where the generated layer of one platform is written.
func layerTemp(spec imageSpec, platform string) string {
	return spec.Out + "." + strings.ReplaceAll(platform, "/", "-") + ".layer.tmp"
}

func removeLayerTemps(spec imageSpec) {
	for _, p := range spec.Platforms {
		os.Remove(layerTemp(spec, p))
	}
}

// expandEntries replaces {os} and {arch} in the entries' host sources with
// platform's, so one spec names each platform's own binary.
func expandEntries(entries []entry, platform string) []entry {
	goos, arch, _ := strings.Cut(platform, "/")
	r := strings.NewReplacer("{os}", goos, "{arch}", arch)
	out := make([]entry, len(entries))
	for i, e := range entries {
		if e.Kind == kindFile || e.Kind == kindTree {
			e.Source = r.Replace(e.Source)
		}
		out[i] = e
	}
	return out
}

func containerConfig(spec imageSpec) v1.Config {
	c := v1.Config{
		Entrypoint: spec.Entrypoint,
		Cmd:        spec.Cmd,
		User:       spec.User,
		WorkingDir: spec.WorkingDir,
		Env:        spec.Env,
		StopSignal: spec.StopSignal,
	}
	if len(spec.Labels) > 0 {
		c.Labels = labelMap(spec.Labels)
	}
	if len(spec.Expose) > 0 {
		c.ExposedPorts = map[string]struct{}{}
		for _, p := range spec.Expose {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			c.ExposedPorts[p] = struct{}{}
		}
	}
	return c
}

// writeArchive writes the docker archive under a temporary name and renames
// it, so a reader never sees half an archive.
func writeArchive(spec imageSpec, img v1.Image) error {
	refs := map[name.Reference]v1.Image{}
	for _, r := range spec.Refs {
		// StrictValidation: the reference must be complete (a tag), as the
		// nodes look images up by exactly these names.
		tag, err := name.NewTag(r, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("reference %q: %w", r, err)
		}
		refs[tag] = img
	}
	tmp := spec.Out + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", spec.Out, err)
	}
	if err := os.Rename(tmp, spec.Out); err != nil {
		return fmt.Errorf("rename archive: %w", err)
	}
	return nil
}

// inputHash hashes everything an archive depends on: the spec itself and
// the content of every host file it reads.
func inputHash(spec imageSpec) (string, error) {
	h := sha256.New()
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "%s\n%s\n", stampVersion, specJSON)
	var files []string
	files = append(files, spec.Layers...)
	var entries []entry
	for _, p := range spec.Platforms {
		entries = append(entries, expandEntries(spec.Entries, p)...)
	}
	if len(spec.Platforms) == 0 { // a layer
		entries = spec.Entries
	}
	for _, e := range entries {
		switch e.Kind {
		case kindFile:
			files = append(files, e.Source)
		case kindTree:
			tree, err := treeFiles(e.Source)
			if err != nil {
				return "", err
			}
			files = append(files, tree...)
		}
	}
	for _, f := range files {
		if err := hashFile(h, f); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// treeFiles lists the paths in a tree, sorted; symbolic links and modes
// are hashed through their names by hashFile.
func treeFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", root, err)
	}
	sort.Strings(files)
	return files, nil
}

// hashFile adds a path's name, type, mode and content (or link target) to h.
func hashFile(h io.Writer, p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	fmt.Fprintf(h, "%s %v\n", p, fi.Mode())
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "-> %s\n", target)
	case fi.Mode().IsRegular():
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.Copy(h, f); err != nil {
			return fmt.Errorf("hash %s: %w", p, err)
		}
	}
	return nil
}

// labelMap turns KEY=VALUE flags into a map.
func labelMap(kvs []string) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// mtime is the generated layer's file time: the epoch given, else 1970.
func (s imageSpec) mtime() time.Time {
	return time.Unix(s.Epoch, 0).UTC()
}

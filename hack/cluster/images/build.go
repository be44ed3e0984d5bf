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

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// stampVersion changes whenever the way images are assembled changes, so
// archives written by an older tool are rebuilt.
const stampVersion = "cluster-images/1"

// buildResult says whether an archive was written or found up to date.
type buildResult struct {
	Cached bool
	Digest string // the image's config digest (its image ID)
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
		return buildResult{Cached: true}, nil
	}
	img, err := assemble(spec)
	if err != nil {
		return buildResult{}, err
	}
	if err := writeArchive(spec, img); err != nil {
		return buildResult{}, err
	}
	if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
		return buildResult{}, fmt.Errorf("write stamp: %w", err)
	}
	id, err := img.ConfigName()
	if err != nil {
		return buildResult{}, err
	}
	return buildResult{Digest: id.String()}, nil
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
	if err := writeLayer(tmp, spec.Entries); err != nil {
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

// assemble stacks the prebuilt layers and the generated one on an empty
// image and sets the config.
func assemble(spec imageSpec) (v1.Image, error) {
	var layers []v1.Layer
	for _, p := range spec.Layers {
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", p, err)
		}
		layers = append(layers, l)
	}
	if len(spec.Entries) > 0 {
		tmp := spec.Out + ".layer.tmp"
		if err := writeLayer(tmp, spec.Entries); err != nil {
			return nil, err
		}
		// The layer is read again when the archive is written; it is removed
		// after that (writeArchive).
		l, err := tarball.LayerFromFile(tmp)
		if err != nil {
			return nil, fmt.Errorf("generated layer: %w", err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, _ = strings.Cut(spec.Platform, "/")
	cf.Config = containerConfig(spec)
	return mutate.ConfigFile(img, cf)
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
	defer os.Remove(spec.Out + ".layer.tmp")
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
	for _, e := range spec.Entries {
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

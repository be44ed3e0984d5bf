package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// writeLayer writes the entries as a gzip'd layer tarball to dst, every
// entry owned by root with mtime: fixed, so the same inputs give the same
// layer digest (and containerd stores a shared layer once). Missing
// parent directories get entries of their own (root-owned, 0755) so the
// layer does not depend on what the layers below it contain.
func writeLayer(dst string, entries []entry, mtime time.Time) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create layer: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	// BestSpeed: the big inputs are Go binaries that barely compress anyway.
	zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	err = writeEntries(layerWriter{tw, mtime}, entries)
	for _, closeErr := range []error{tw.Close(), zw.Close(), bw.Flush(), f.Close()} {
		if err == nil {
			err = closeErr
		}
	}
	if err != nil {
		return fmt.Errorf("write layer %s: %w", dst, err)
	}
	return nil
}

// layerWriter writes every header with the layer's one mtime (and, as
// tar.Header's zero values, owner 0:0 without names).
type layerWriter struct {
	*tar.Writer
	mtime time.Time
}

func (w layerWriter) WriteHeader(h *tar.Header) error {
	h.ModTime = w.mtime
	return w.Writer.WriteHeader(h)
}

func writeEntries(tw layerWriter, entries []entry) error {
	written := map[string]bool{}
	for _, dir := range parentDirs(entries) {
		if err := tw.WriteHeader(dirHeader(dir, 0o755)); err != nil {
			return err
		}
		written[dir] = true
	}
	for _, e := range entries {
		if err := writeEntry(tw, e, written); err != nil {
			return fmt.Errorf("%s %s: %w", e.Kind, e.Path, err)
		}
	}
	return nil
}

// parentDirs lists the parent directories of all entries, parents first.
func parentDirs(entries []entry) []string {
	seen := map[string]bool{}
	for _, e := range entries {
		for dir := path.Dir(e.Path); dir != "/"; dir = path.Dir(dir) {
			seen[dir] = true
		}
	}
	// An entry that is itself a directory is written with its own mode.
	for _, e := range entries {
		if e.Kind == kindDir || e.Kind == kindTree {
			delete(seen, e.Path)
		}
	}
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs) // "/a" sorts before "/a/b"
	return dirs
}

func writeEntry(tw layerWriter, e entry, written map[string]bool) error {
	switch e.Kind {
	case kindDir:
		return tw.WriteHeader(dirHeader(e.Path, e.Mode))
	case kindSymlink:
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: tarName(e.Path),
			Linkname: e.Source, Mode: 0o777})
	case kindFile:
		fi, err := os.Stat(e.Source)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", e.Source)
		}
		return copyFile(tw, e.Source, e.Path, fi)
	case kindTree:
		return writeTree(tw, e, written)
	}
	return fmt.Errorf("unknown entry kind %q", e.Kind)
}

// writeTree copies a host directory tree: directories, regular files and
// symbolic links, with their modes, owned by root.
func writeTree(tw layerWriter, e entry, written map[string]bool) error {
	return filepath.WalkDir(e.Source, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(e.Source, p)
		if err != nil {
			return err
		}
		dst := path.Join(e.Path, filepath.ToSlash(rel))
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			if written[dst] || dst == "/" {
				return nil
			}
			return tw.WriteHeader(dirHeader(dst, tarMode(fi.Mode())))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: tarName(dst),
				Linkname: target, Mode: 0o777})
		case fi.Mode().IsRegular():
			return copyFile(tw, p, dst, fi)
		}
		return fmt.Errorf("%s: unsupported file type %v", p, fi.Mode().Type())
	})
}

func copyFile(tw layerWriter, src, dst string, fi fs.FileInfo) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: tarName(dst), Size: fi.Size(),
		Mode: tarMode(fi.Mode())}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

func dirHeader(p string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: tarName(p) + "/", Mode: mode}
}

// tarName is an image path as layer tarballs spell it: relative, "./"-less.
func tarName(p string) string {
	return strings.TrimPrefix(p, "/")
}

// tarMode is a file's permission bits plus setuid, setgid and sticky (a
// tree's /tmp is 1777).
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// imageSpec describes one image: its references, the layers it is made of
// (prebuilt layer tarballs first, then one generated layer with the
// entries), and its config.
type imageSpec struct {
	Out       string   // archive to write
	Format    string   // formatDocker or formatOCI
	Refs      []string // image references the archive names the image by
	Layers    []string // prebuilt layer tarballs (gzip or plain), in order
	Entries   []entry  // contents of the generated top layer; {os} and {arch} in a source expand per platform
	Platforms []string // os/arch, one image each (docker: exactly one)
	Epoch     int64    // Unix seconds: the generated layer's mtimes and, when not 0, the config's created time
	Labels    []string // KEY=VALUE config labels (OCI: also the index's annotations)

	Entrypoint []string
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	Expose     []string
	StopSignal string
}

// The archive formats build writes.
const (
	formatDocker = "docker" // docker load's: manifest.json with RepoTags
	formatOCI    = "oci"    // an OCI image layout, with manifest.json for docker load too
)

// entryKind says what an entry of the generated layer is.
type entryKind string

const (
	kindFile    entryKind = "file"    // a regular file copied from Source
	kindDir     entryKind = "dir"     // an empty directory
	kindSymlink entryKind = "symlink" // a symbolic link to Source
	kindTree    entryKind = "tree"    // a directory tree copied from Source
)

// entry is one path of the generated layer.
type entry struct {
	Kind   entryKind
	Path   string // absolute path inside the image
	Source string // host path (file, tree) or link target (symlink)
	Mode   int64  // permission bits for dirs; 0 keeps a file's own mode
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// entryFlag parses a repeatable "PATH=SOURCE" flag into entries of one kind.
type entryFlag struct {
	kind    entryKind
	entries *[]entry
}

func (e entryFlag) String() string { return "" }

func (e entryFlag) Set(v string) error {
	ent, err := parseEntry(e.kind, v)
	if err != nil {
		return err
	}
	*e.entries = append(*e.entries, ent)
	return nil
}

// parseEntry reads "PATH=SOURCE" (file, tree, symlink) or "PATH[:MODE]"
// (dir, MODE in octal).
func parseEntry(kind entryKind, v string) (entry, error) {
	if kind == kindDir {
		path, mode, hasMode := strings.Cut(v, ":")
		ent := entry{Kind: kind, Path: path, Mode: 0o755}
		if hasMode {
			if _, err := fmt.Sscanf(mode, "%o", &ent.Mode); err != nil {
				return entry{}, fmt.Errorf("dir %q: mode %q is not octal", v, mode)
			}
		}
		return ent, checkPath(ent.Path)
	}
	path, source, ok := strings.Cut(v, "=")
	if !ok || source == "" {
		return entry{}, fmt.Errorf("%s %q: want PATH=SOURCE", kind, v)
	}
	return entry{Kind: kind, Path: path, Source: source}, checkPath(path)
}

func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") || slices.Contains(strings.Split(p, "/"), "..") {
		return fmt.Errorf("image path %q must be absolute, with no .. element", p)
	}
	return nil
}

// jsonListFlag is a flag holding a JSON array of strings, as a Dockerfile's
// exec form: -entrypoint '["/agnhost"]'.
type jsonListFlag struct{ list *[]string }

func (j jsonListFlag) String() string { return "" }

func (j jsonListFlag) Set(v string) error {
	var list []string
	if err := json.Unmarshal([]byte(v), &list); err != nil {
		return fmt.Errorf("want a JSON array of strings: %w", err)
	}
	*j.list = list
	return nil
}

// parseSpec parses the flags of the build subcommand or, with layerOnly,
// of the layer subcommand (no references, no config).
func parseSpec(args []string, layerOnly bool, stderr io.Writer) (imageSpec, error) {
	var s imageSpec
	cmd := "build"
	if layerOnly {
		cmd = "layer"
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.Out, "out", "", "archive to write (required)")
	fs.StringVar(&s.Format, "format", formatDocker, "archive format: docker (docker load's) or oci (an OCI image layout, every -platform in one index)")
	fs.Var((*listFlag)(&s.Refs), "ref", "image reference (repeatable, at least one)")
	fs.Var((*listFlag)(&s.Layers), "layer", "prebuilt layer tarball, gzip or plain (repeatable, in order)")
	fs.Var(entryFlag{kindFile, &s.Entries}, "file", "PATH=HOSTFILE: copy a file, keeping its mode (repeatable)")
	fs.Var(entryFlag{kindTree, &s.Entries}, "tree", "PATH=HOSTDIR: copy a directory tree (repeatable)")
	fs.Var(entryFlag{kindSymlink, &s.Entries}, "symlink", "PATH=TARGET: a symbolic link (repeatable)")
	fs.Var(entryFlag{kindDir, &s.Entries}, "dir", "PATH[:MODE]: an empty directory, mode 755 unless given (repeatable)")
	fs.Var((*listFlag)(&s.Platforms), "platform", "os/arch of an image (repeatable with -format oci; default linux/amd64)")
	fs.Int64Var(&s.Epoch, "epoch", 0, "Unix time of the generated layer's files and of the config's created field (e.g. $SOURCE_DATE_EPOCH)")
	fs.Var((*listFlag)(&s.Labels), "label", "KEY=VALUE config label (repeatable)")
	fs.Var(jsonListFlag{&s.Entrypoint}, "entrypoint", `ENTRYPOINT as a JSON array, e.g. '["/pause"]'`)
	fs.Var(jsonListFlag{&s.Cmd}, "cmd", `CMD as a JSON array, e.g. '["pause"]'`)
	fs.StringVar(&s.User, "user", "", "USER, e.g. 65535:65535")
	fs.StringVar(&s.WorkingDir, "workdir", "", "WORKDIR")
	fs.Var((*listFlag)(&s.Env), "env", "KEY=VALUE (repeatable)")
	fs.Var((*listFlag)(&s.Expose), "expose", "PORT/PROTO, e.g. 53/udp (repeatable)")
	fs.StringVar(&s.StopSignal, "stopsignal", "", "STOPSIGNAL, e.g. SIGQUIT")
	if err := fs.Parse(args); err != nil {
		return imageSpec{}, err
	}
	if fs.NArg() > 0 {
		return imageSpec{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if layerOnly {
		return s, s.validateLayer()
	}
	if len(s.Platforms) == 0 {
		s.Platforms = []string{"linux/amd64"}
	}
	return s, s.validate()
}

// validateLayer checks a layer subcommand's spec: only -out and entries.
func (s imageSpec) validateLayer() error {
	if s.Out == "" {
		return errors.New("-out is required")
	}
	c := containerConfig(s)
	if len(s.Refs)+len(s.Layers)+len(s.Platforms)+len(s.Labels) > 0 || s.Format != formatDocker || c.Entrypoint != nil || c.Cmd != nil || c.User != "" ||
		c.WorkingDir != "" || c.Env != nil || c.ExposedPorts != nil || c.StopSignal != "" {
		return errors.New("layer takes only -out, -file, -tree, -symlink and -dir")
	}
	if len(s.Entries) == 0 {
		return errors.New("layer needs at least one -file, -tree, -symlink or -dir")
	}
	return nil
}

func (s imageSpec) validate() error {
	var errs []error
	if s.Out == "" {
		errs = append(errs, errors.New("-out is required"))
	}
	if len(s.Refs) == 0 {
		errs = append(errs, errors.New("at least one -ref is required"))
	}
	for _, kv := range append(slices.Clone(s.Env), s.Labels...) {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("-env or -label %q: want KEY=VALUE", kv))
		}
	}
	for _, p := range s.Platforms {
		if os, arch, ok := strings.Cut(p, "/"); !ok || os == "" || arch == "" {
			errs = append(errs, fmt.Errorf("-platform %q: want os/arch", p))
		}
	}
	switch {
	case s.Format != formatDocker && s.Format != formatOCI:
		errs = append(errs, fmt.Errorf("-format %q: want docker or oci", s.Format))
	case s.Format == formatDocker && len(s.Platforms) != 1:
		errs = append(errs, errors.New("-format docker holds one -platform; use -format oci for several"))
	}
	if s.Epoch < 0 {
		errs = append(errs, fmt.Errorf("-epoch %d: want Unix seconds", s.Epoch))
	}
	return errors.Join(errs...)
}

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
	Out      string   // docker archive to write
	Refs     []string // image references written as the archive's RepoTags
	Layers   []string // prebuilt layer tarballs (gzip or plain), in order
	Entries  []entry  // contents of the generated top layer
	Platform string   // os/arch

	Entrypoint []string
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	Expose     []string
	StopSignal string
}

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
	fs.StringVar(&s.Out, "out", "", "docker archive to write (required)")
	fs.Var((*listFlag)(&s.Refs), "ref", "image reference (repeatable, at least one)")
	fs.Var((*listFlag)(&s.Layers), "layer", "prebuilt layer tarball, gzip or plain (repeatable, in order)")
	fs.Var(entryFlag{kindFile, &s.Entries}, "file", "PATH=HOSTFILE: copy a file, keeping its mode (repeatable)")
	fs.Var(entryFlag{kindTree, &s.Entries}, "tree", "PATH=HOSTDIR: copy a directory tree (repeatable)")
	fs.Var(entryFlag{kindSymlink, &s.Entries}, "symlink", "PATH=TARGET: a symbolic link (repeatable)")
	fs.Var(entryFlag{kindDir, &s.Entries}, "dir", "PATH[:MODE]: an empty directory, mode 755 unless given (repeatable)")
	fs.StringVar(&s.Platform, "platform", "linux/amd64", "os/arch of the image")
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
	return s, s.validate()
}

// validateLayer checks a layer subcommand's spec: only -out and entries.
func (s imageSpec) validateLayer() error {
	if s.Out == "" {
		return errors.New("-out is required")
	}
	c := containerConfig(s)
	if len(s.Refs)+len(s.Layers) > 0 || c.Entrypoint != nil || c.Cmd != nil || c.User != "" ||
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
	for _, env := range s.Env {
		if k, _, ok := strings.Cut(env, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("-env %q: want KEY=VALUE", env))
		}
	}
	if os, arch, ok := strings.Cut(s.Platform, "/"); !ok || os == "" || arch == "" {
		errs = append(errs, fmt.Errorf("-platform %q: want os/arch", s.Platform))
	}
	return errors.Join(errs...)
}

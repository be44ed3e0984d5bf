package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
)

// memoryCgroup is the process's memory cgroup: the directory of its
// control files (a path in the filesystem fsys, rooted at "/", that
// found it) and the mount point of its hierarchy, where the walk up
// its ancestors stops.
type memoryCgroup struct {
	dir, mount string
	v2         bool
}

// errNoMemoryCgroup: no memory controller in /proc/self/cgroup, or no
// mount of its hierarchy that holds the process's cgroup.
var errNoMemoryCgroup = errors.New("no memory cgroup mounted")

// findMemoryCgroup resolves the process's memory cgroup: /proc/self/cgroup
// names it within its hierarchy, /proc/self/mountinfo says where (which
// part of) that hierarchy is mounted. A container sees its own cgroup as
// the mount's root (a cgroup namespace, or a bind mount whose root field
// is the cgroup), a process on a host the whole hierarchy; either way the
// directory is the mount point joined with the cgroup's path below the
// mount's root. The v1 memory controller comes first: on a hybrid host
// the cgroup2 mount has no memory controller.
func findMemoryCgroup(fsys fs.FS) (memoryCgroup, error) {
	self, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return memoryCgroup{}, err
	}
	mounts, err := fs.ReadFile(fsys, "proc/self/mountinfo")
	if err != nil {
		return memoryCgroup{}, err
	}
	var v1, v2 string
	haveV1, haveV2 := false, false
	for line := range strings.Lines(string(self)) {
		id, rest, _ := strings.Cut(strings.TrimSpace(line), ":")
		controllers, p, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			v1, haveV1 = p, true
		case id == "0" && controllers == "":
			v2, haveV2 = p, true
		}
	}
	for _, want := range []struct {
		have bool
		v2   bool
		p    string
	}{{haveV1, false, v1}, {haveV2, true, v2}} {
		if !want.have {
			continue
		}
		if c, ok := mountedCgroup(mounts, want.p, want.v2); ok {
			return c, nil
		}
	}
	return memoryCgroup{}, errNoMemoryCgroup
}

// mountedCgroup finds, in mountinfo's text, the first mount of the v1
// memory hierarchy (or the cgroup2 one) whose root holds cgroup p.
func mountedCgroup(mountinfo []byte, p string, v2 bool) (memoryCgroup, bool) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// id parent major:minor root mount-point options [tags] - type source super-options
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 5 || len(f) < sep+4 {
			continue
		}
		root, mount, fstype := f[3], f[4], f[sep+1]
		memoryV1 := fstype == "cgroup" && slices.Contains(strings.Split(f[sep+3], ","), "memory")
		if v2 && fstype != "cgroup2" || !v2 && !memoryV1 {
			continue
		}
		rel, ok := p, root == "/"
		if !ok {
			rest, found := strings.CutPrefix(p, root)
			rel, ok = rest, found && (rest == "" || rest[0] == '/') // root /a holds /a/b, not /ab
		}
		// A cgroup outside the namespace's root ("/../x") is not mounted here.
		if ok && !strings.Contains(rel, "/..") {
			return memoryCgroup{dir: strings.TrimPrefix(path.Join(mount, rel), "/"), mount: strings.TrimPrefix(mount, "/"), v2: v2}, true
		}
	}
	return memoryCgroup{}, false
}

// cgroupMemoryLimit is the memory limit of the process's cgroup and the
// file that set it (0: none), read through fsys rooted at "/".
func cgroupMemoryLimit(fsys fs.FS) (int64, string, error) {
	c, err := findMemoryCgroup(fsys)
	if err != nil {
		return 0, "", err
	}
	return c.limit(fsys)
}

// unlimited is where a limit file's value means no limit: v1 writes
// MaxInt64 rounded down to a page, v2 "max".
const unlimited = 1 << 62

// limit is the cgroup's memory limit: the lowest of its own and its
// ancestors' up to the mount (a Kubernetes container's and its pod's
// both bind it), and the file that set it. No limit: 0. A missing file
// is skipped: v2's root cgroup has none, nor a cgroup whose parent does
// not enable the memory controller for its children.
func (c memoryCgroup) limit(fsys fs.FS) (int64, string, error) {
	name := "memory.limit_in_bytes"
	if c.v2 {
		name = "memory.max"
	}
	least, from := int64(math.MaxInt64), ""
	for dir := c.dir; ; dir = path.Dir(dir) {
		file := path.Join(dir, name)
		b, err := fs.ReadFile(fsys, file)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return 0, "", err
		default:
			s := strings.TrimSpace(string(b))
			v, err := strconv.ParseInt(s, 10, 64)
			if s != "max" && err != nil {
				return 0, "", fmt.Errorf("reading /%s: %w", file, err)
			}
			if s != "max" && v < least {
				least, from = v, "/"+file
			}
		}
		if dir == c.mount || dir == "." || dir == "" {
			break
		}
	}
	if least >= unlimited {
		return 0, "", nil
	}
	return least, from, nil
}

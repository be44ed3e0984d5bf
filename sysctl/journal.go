package sysctl

import (
	"slices"
	"strings"
	"sync"
)

// Change is a key the proxy changed: its file, the value it had before the
// first change and the value written last.
type Change struct {
	Path, Before, After string
}

// Journal remembers the keys that writes through a Sysctl changed (see
// WithJournal), so that they can be put back when the proxy is removed.
// It is safe for concurrent use.
type Journal struct {
	mu      sync.Mutex
	changes map[string]Change
}

// changed records a write of after to the file p, which held before.
func (j *Journal) changed(p, before, after string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.changes == nil {
		j.changes = map[string]Change{}
	}
	c, seen := j.changes[p]
	if !seen {
		c = Change{Path: p, Before: before}
	}
	c.After = after
	if c.After == c.Before {
		delete(j.changes, p) // written back as it was
		return
	}
	j.changes[p] = c
}

// Changes lists the keys changed, by file.
func (j *Journal) Changes() []Change {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Change, 0, len(j.changes))
	for _, c := range j.changes {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

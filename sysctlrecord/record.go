// Package sysctlrecord keeps, in the node's own kernel, the sysctls the
// proxy changed and the values they had before, so that --cleanup can put
// them back after the proxy is gone. The record is an nftables table that
// hooks nowhere, `ip kube-nftproxy-sysctls`, one set element a key, its
// comment the key's file, the value before and the value set: it lives as
// long as the network namespace, needs no file on the node, and
// `nft list ruleset` shows it.
package sysctlrecord

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

// TableName is the record's table, in the ip family.
const TableName = "kube-nftproxy-sysctls"

// table is the record holding changes, one element each (its key is the
// element's number: the set needs one; the comment says everything).
func table(changes []sysctl.Change) (*nftlib.Table, error) {
	set := &nftlib.Map{Name: "changed", Key: []nftlib.Field{nftlib.FieldDport}, Plain: true,
		Comment: "a key kube-nftproxy changed: file: before -> set"}
	var tooLong []string
	for i, c := range changes {
		comment := fmt.Sprintf("%s: %s -> %s", c.Path, c.Before, c.After)
		if len(comment) > nftlib.MaxComment || i >= 1<<16-1 {
			tooLong = append(tooLong, c.Path)
			continue
		}
		set.Elements = append(set.Elements, nftlib.Element{Key: nftlib.Key{Port: uint16(i + 1)}, Comment: comment})
	}
	t := &nftlib.Table{Family: nftlib.IPv4, Name: TableName, Maps: []*nftlib.Map{set},
		Comment: "sysctls kube-nftproxy changed; kube-nftproxy --cleanup puts them back"}
	if len(tooLong) > 0 {
		return t, fmt.Errorf("not recorded, the record would pass nftables' comment limit: %s", strings.Join(tooLong, ", "))
	}
	return t, nil
}

// parse reads an element's comment back into a Change.
func parse(comment string) (sysctl.Change, bool) {
	path, values, ok := strings.Cut(comment, ": ")
	if !ok {
		return sysctl.Change{}, false
	}
	before, after, ok := strings.Cut(values, " -> ")
	return sysctl.Change{Path: path, Before: before, After: after}, ok && filepath.IsAbs(path)
}

// read returns the changes the kernel's record holds (none without a
// record) and whether the table exists.
func read(k *nftlib.Kernel) ([]sysctl.Change, *nftlib.KernelTable, error) {
	t, _ := table(nil)
	kts, err := k.ReadFamily(t.Family, []string{t.Name}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the sysctl record: %w", err)
	}
	kt := kts[t.Name]
	if !kt.Exists {
		return nil, kt, nil
	}
	elems, err := k.ReadElements(t, kt)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the sysctl record: %w", err)
	}
	var out []sysctl.Change
	for _, e := range elems[t.Maps[0].Name] {
		if c, ok := parse(e.Comment); ok {
			out = append(out, c)
		}
	}
	return out, kt, nil
}

// Save adds changes to the kernel's record in one transaction. A key
// already recorded keeps its value before (the node's, from before the
// proxy's first change), with the value set now.
func Save(k *nftlib.Kernel, changes []sysctl.Change) error {
	if len(changes) == 0 {
		return nil
	}
	have, kt, err := read(k)
	if err != nil {
		return err
	}
	merged := merge(have, changes)
	t, terr := table(merged)
	x, _ := nftlib.FullTx(t, kt, false)
	tx := k.NewTx()
	var setID uint32
	x.Write(tx, &setID)
	if err := k.CommitTx(tx); err != nil {
		return fmt.Errorf("writing the sysctl record: %w", err)
	}
	return terr
}

// merge is have with changes added: a file in both keeps have's Before.
func merge(have, changes []sysctl.Change) []sysctl.Change {
	out := append([]sysctl.Change(nil), have...)
	for _, c := range changes {
		i := slices.IndexFunc(out, func(h sysctl.Change) bool { return h.Path == c.Path })
		if i < 0 {
			out = append(out, c)
			continue
		}
		out[i].After = c.After
	}
	return out
}

// Restore puts back each recorded key that still holds the value the
// proxy set, through the Sysctl of roots whose root holds its file (a file
// under none is left alone: the record names only /proc/sys and
// /sys/module keys), then deletes the record. A key another program has
// changed since is left as it is, and logged. When a key cannot be
// written (a container without a writable /proc/sys), the record stays
// for a later --cleanup with the privilege, and the error says so.
func Restore(k *nftlib.Kernel, roots []*sysctl.Sysctl, log *slog.Logger) (restored []sysctl.Change, err error) {
	have, kt, err := read(k)
	if err != nil || !kt.Exists {
		return nil, err
	}
	var errs []error
	for _, c := range have {
		done, err := restore(c, roots, log)
		if err != nil {
			errs = append(errs, err)
		}
		if done {
			restored = append(restored, c)
		}
	}
	if len(errs) > 0 {
		return restored, fmt.Errorf("the record %s stays for another --cleanup: %w", TableName, errors.Join(errs...))
	}
	tx := k.NewTx()
	tx.DelTable(nftlib.IPv4, TableName)
	if err := k.CommitTx(tx); err != nil {
		return restored, fmt.Errorf("deleting the sysctl record: %w", err)
	}
	return restored, nil
}

// restore puts one key back; false when it is left as it is.
func restore(c sysctl.Change, roots []*sysctl.Sysctl, log *slog.Logger) (bool, error) {
	for _, s := range roots {
		key, err := filepath.Rel(s.Root(), c.Path)
		if err != nil || !filepath.IsLocal(key) {
			continue
		}
		key = filepath.ToSlash(key)
		now, err := s.Get(key)
		if err != nil {
			log.Warn("not putting a sysctl back: it cannot be read", "key", c.Path, "err", err)
			return false, nil
		}
		if now != c.After {
			log.Warn("not putting a sysctl back: it has changed since the proxy set it", "key", c.Path, "set", c.After, "now", now)
			return false, nil
		}
		if err := s.Set(key, c.Before); err != nil {
			return false, err
		}
		return true, nil
	}
	log.Warn("not putting a sysctl back: its file is not under /proc/sys or /sys/module", "key", c.Path)
	return false, nil
}

package sysctlrecord

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
	"github.com/kube-nftproxy/kube-nftproxy/sysctl"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		comment string
		want    sysctl.Change
		ok      bool
	}{
		{"/proc/sys/net/ipv4/conf/all/route_localnet: 0 -> 1", sysctl.Change{Path: "/proc/sys/net/ipv4/conf/all/route_localnet", Before: "0", After: "1"}, true},
		{"/sys/module/nf_conntrack/parameters/hashsize: 65536 -> 131072", sysctl.Change{Path: "/sys/module/nf_conntrack/parameters/hashsize", Before: "65536", After: "131072"}, true},
		{"proc/sys/x: 0 -> 1", sysctl.Change{}, false}, // a relative path is nobody's record
		{"a key kube-nftproxy changed", sysctl.Change{}, false},
		{"/proc/sys/x: 0", sysctl.Change{}, false},
	} {
		got, ok := parse(tc.comment)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("parse(%q) = %+v, %v; want %+v, %v", tc.comment, got, ok, tc.want, tc.ok)
		}
	}
}

// kernelIn opens nftables in a new network namespace; it also returns the
// namespace, for nft.
func kernelIn(t *testing.T) (*nftlib.Kernel, string) {
	t.Helper()
	ns := testns.New(t, "knp-sysrec-")
	k, err := nftlib.OpenKernel(testns.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k, ns
}

// keys makes a sysctl tree under a temporary root.
func keys(t *testing.T, files map[string]string) *sysctl.Sysctl {
	t.Helper()
	root := t.TempDir()
	for k, v := range files {
		p := filepath.Join(root, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sysctl.New(root)
}

// TestKernelSaveRestore records the changes of two starts of the proxy in
// the kernel, then puts back what the proxy changed and nothing else.
func TestKernelSaveRestore(t *testing.T) {
	k, ns := kernelIn(t)
	s := keys(t, map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
		"net/ipv4/conf/all/route_localnet":                   "0",
	})
	start := func(writes map[string]int) {
		var j sysctl.Journal
		w := s.WithJournal(&j)
		for key, v := range writes {
			if err := w.SetInt(key, v); err != nil {
				t.Fatal(err)
			}
		}
		if err := Save(k, j.Changes()); err != nil {
			t.Fatal(err)
		}
	}
	start(map[string]int{"net/netfilter/nf_conntrack_tcp_timeout_established": 86400, "net/netfilter/nf_conntrack_tcp_timeout_close_wait": 3600})
	// A second start, with another timeout, sets one key more: the value
	// before stays the node's.
	start(map[string]int{"net/netfilter/nf_conntrack_tcp_timeout_established": 7200, "net/ipv4/conf/all/route_localnet": 1})
	listing := testns.NFT(t, ns, "list", "table", "ip", TableName)
	for _, want := range []string{
		"nf_conntrack_tcp_timeout_established: 432000 -> 7200",
		"nf_conntrack_tcp_timeout_close_wait: 60 -> 3600",
		"route_localnet: 0 -> 1",
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("the record lacks %q:\n%s", want, listing)
		}
	}
	// Another program changes one key after the proxy.
	if err := s.SetInt("net/netfilter/nf_conntrack_tcp_timeout_close_wait", 120); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	restored, err := Restore(k, []*sysctl.Sysctl{sysctl.New(t.TempDir()), s}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if len(restored) != 2 {
		t.Errorf("restored %v, want the two keys still as the proxy set them", restored)
	}
	for key, want := range map[string]int{
		"net/netfilter/nf_conntrack_tcp_timeout_established": 432000,
		"net/ipv4/conf/all/route_localnet":                   0,
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  120, // another program's value stays
	} {
		if got, err := s.GetInt(key); err != nil || got != want {
			t.Errorf("%s = %d, %v; want %d", key, got, err, want)
		}
	}
	if !strings.Contains(logs.String(), "changed since the proxy set it") {
		t.Errorf("the key left alone was not logged:\n%s", logs.String())
	}
	if out := testns.NFT(t, ns, "list", "tables"); strings.Contains(out, TableName) {
		t.Errorf("the record is still there:\n%s", out)
	}
	if restored, err := Restore(k, []*sysctl.Sysctl{s}, slog.New(slog.DiscardHandler)); err != nil || len(restored) != 0 {
		t.Errorf("without a record: restored %v, %v; want nothing", restored, err)
	}
}

// TestKernelRestoreReadOnly keeps the record when a key cannot be written
// back, for a --cleanup with the privilege.
func TestKernelRestoreReadOnly(t *testing.T) {
	k, _ := kernelIn(t)
	s := keys(t, map[string]string{"net/ipv4/conf/all/route_localnet": "1"})
	p := filepath.Join(s.Root(), "net/ipv4/conf/all/route_localnet")
	if err := Save(k, []sysctl.Change{{Path: p, Before: "0", After: "1"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(k, []*sysctl.Sysctl{s}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "stays for another --cleanup") {
		t.Fatalf("Restore of a read-only key: %v", err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	restored, err := Restore(k, []*sysctl.Sysctl{s}, slog.New(slog.DiscardHandler))
	if err != nil || len(restored) != 1 {
		t.Fatalf("second Restore: %v, %v", restored, err)
	}
}

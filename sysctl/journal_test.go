package sysctl

import (
	"fmt"
	"path/filepath"
	"testing"
)

func TestJournal(t *testing.T) {
	root := tree(t, map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000\n",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60\n",
		"net/ipv4/conf/all/route_localnet":                   "0\n",
		"net/ipv4/vs/conntrack":                              "1\n",
	})
	var j Journal
	s := New(root).WithJournal(&j)
	for _, w := range []struct {
		key   string
		value int
	}{
		{"net/netfilter/nf_conntrack_tcp_timeout_established", 86400},
		{"net/netfilter/nf_conntrack_tcp_timeout_established", 7200}, // the first value before is kept
		{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", 3600},
		{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", 60}, // back as it was: nothing to put back
		{"net/ipv4/vs/conntrack", 1},                              // unchanged
		{"net/ipv4/conf/all/route_localnet", 1},
	} {
		if err := s.SetInt(w.key, w.value); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetInt("net/missing", 1); err == nil {
		t.Fatal("a missing key was written")
	}
	// A Sysctl without the journal changes nothing in it.
	if err := New(root).SetInt("net/ipv4/vs/conntrack", 0); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(j.Changes())
	want := fmt.Sprint([]Change{
		{filepath.Join(root, "net/ipv4/conf/all/route_localnet"), "0", "1"},
		{filepath.Join(root, "net/netfilter/nf_conntrack_tcp_timeout_established"), "432000", "7200"},
	})
	if got != want {
		t.Errorf("Changes() =\n%s\nwant\n%s", got, want)
	}
}

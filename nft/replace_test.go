package nft

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"syscall"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/nftlib"
)

// TestMarkReplace: after a full sync the kernel refused, the next one
// replaces the refused table whole; when the refusal names none of ours,
// or its answer was lost (no TxError at all), every table, so that a sync
// never fails for ever on a table of ours.
func TestMarkReplace(t *testing.T) {
	want := map[tableID]*nftlib.Table{}
	for _, id := range tableIDs() {
		want[id] = &nftlib.Table{Family: id.f, Name: fmt.Sprintf("t-%s-%d", id.f, id.kind)}
	}
	first := tableIDs()[0]
	cases := []struct {
		name string
		err  error
		all  bool
	}{
		{"refusal naming a table of ours", &nftlib.TxError{Op: "add element", Errno: syscall.ENFILE, Family: first.f, Table: want[first].Name}, false},
		{"refusal naming another table", &nftlib.TxError{Op: "add table", Errno: syscall.EEXIST, Family: first.f, Table: "other"}, true},
		{"answer lost", fmt.Errorf("reading transaction result: %w", syscall.ENOBUFS), true},
		{"any other error", errors.New("netlink socket closed"), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := &Backend{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			b.markReplace(c.err, want)
			for _, id := range tableIDs() {
				wantReplaced := c.all || id == first
				if b.replace[id] != wantReplaced {
					t.Errorf("table %s: replace = %v, want %v", want[id].Name, b.replace[id], wantReplaced)
				}
			}
		})
	}
}

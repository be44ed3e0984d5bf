package testutil

import (
	"slices"
	"testing"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/internal/instance"
	"github.com/kube-nftproxy/kube-nftproxy/sysctlrecord"
)

func TestSortedListing(t *testing.T) {
	a := "table ip t {\n\tmap m {\n\t\telements = { 1 : jump x,\n\t\t\t     2 : jump y }\n\t}\n}\n"
	b := "table ip t {\n\tmap m {\n\t\telements = { 2 : jump y,\n\t\t\t     1 : jump x }\n\t}\n}\n"
	if SortedText(a) != SortedText(b) {
		t.Errorf("listings differing only in element order:\n%s\n---\n%s", SortedText(a), SortedText(b))
	}
	want := []string{"1 : jump x", "2 : jump y", "map m {", "table ip t {", "}", "}"}
	if got := SortedListing(a); !slices.Equal(got, want) {
		t.Errorf("SortedListing = %q, want %q", got, want)
	}
	lock := "table ip kube-nftproxy-lock { # progname kube-nftproxy\n\tflags owner\n\tcomment \"held by pid 7\"\n}\n"
	if got := SortedListing(lock + a); !slices.Equal(got, want) {
		t.Errorf("SortedListing with the lock table = %q, want %q", got, want)
	}
	record := "table ip kube-nftproxy-sysctls {\n\tcomment \"sysctls\"\n\tset changed {\n\t\ttype inet_service\n\t\telements = { 1 comment \"/proc/sys/x: 0 -> 1\" }\n\t}\n}\n"
	if got := SortedListing(a + record + lock); !slices.Equal(got, want) {
		t.Errorf("SortedListing with the sysctl record = %q, want %q", got, want)
	}
}

// LockTable follows the lock's table (testutil cannot import instance,
// whose tests use testutil).
func TestLockTableName(t *testing.T) {
	if want := "table " + instance.TableFamily.String() + " " + instance.TableName + " {"; LockTable != want {
		t.Errorf("LockTable = %q, want %q", LockTable, want)
	}
	if want := "table ip " + sysctlrecord.TableName + " {"; RecordTable != want {
		t.Errorf("RecordTable = %q, want %q", RecordTable, want)
	}
}

func TestListingDiff(t *testing.T) {
	for _, tc := range []struct {
		got, want []string
		diff      string
	}{
		{[]string{"a", "b"}, []string{"a", "b"}, ""},
		{[]string{"a", "c"}, []string{"a", "b"}, `1 lines only in got ["c"]; 1 lines only in want ["b"]`},
		{[]string{"a", "a"}, []string{"a"}, `1 lines only in got ["a"]; 0 lines only in want []`},
	} {
		if d := ListingDiff(tc.got, tc.want, "got", "want"); d != tc.diff {
			t.Errorf("ListingDiff(%q, %q) = %q, want %q", tc.got, tc.want, d, tc.diff)
		}
	}
}

func TestWaitFor(t *testing.T) {
	start := time.Now()
	WaitFor(t, 5*time.Second, "20 ms to pass", func() bool { return time.Since(start) > 20*time.Millisecond })
}

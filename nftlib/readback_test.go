package nftlib

import (
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/internal/testns"
)

// statefulText is what ReadFamily read of kt's stateful objects and
// flowtables: "" when it read none, else each as "kind name".
func statefulText(kt *KernelTable) string {
	if !kt.stateful {
		return ""
	}
	read := []string{"read:"}
	for _, o := range kt.objs {
		read = append(read, o.kind()+" "+o.Name)
	}
	for _, f := range kt.flowtables {
		read = append(read, "flowtable "+f)
	}
	return strings.Join(read, " ")
}

// Reading tables back costs no dump of stateful objects or flowtables
// while a table's use count says it holds only chains and sets (asked for
// by name, or dumped family-wide); a table with another process's object
// has them read, and only that table.
func TestKernelReadFamilyStatefulOnlyWhenCounted(t *testing.T) {
	ns := testns.New(t, "knp-nft-")
	testns.NFTScript(t, ns, `table ip a {
	set s { type ipv4_addr; }
	chain c { jump d; }
	chain d { }
}
table ip b {
	chain c { }
}
`)
	k := openTestKernel(t, ns)
	named := map[string][]string{"a": {"c", "d"}, "b": {"c"}}
	steps := []struct {
		what   string
		script string              // run first, when not ""
		expect map[string][]string // nil: chains dumped family-wide
		want   map[string]string   // statefulText per table
	}{
		{"chains named", "", named, map[string]string{"a": "", "b": ""}},
		{"chains dumped", "", nil, map[string]string{"a": "", "b": ""}},
		{"a quota in b, chains named", "add quota ip b q { over 1 mbytes }", named, map[string]string{"a": "", "b": "read: quota q"}},
		{"a quota in b, chains dumped", "", nil, map[string]string{"a": "", "b": "read: quota q"}},
	}
	for _, s := range steps {
		if s.script != "" {
			testns.NFTScript(t, ns, s.script+"\n")
		}
		kts, err := k.ReadFamily(IPv4, []string{"a", "b"}, s.expect)
		if err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		for name, want := range s.want {
			if got := statefulText(kts[name]); got != want {
				t.Errorf("%s: ip %s: stateful %q, want %q", s.what, name, got, want)
			}
		}
	}
}

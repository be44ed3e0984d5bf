package nftlib

import (
	"fmt"
	"testing"
)

// ChainsNamed finds fixed and fragment chains in the order asked, and
// says when one is missing.
func TestChainsNamed(t *testing.T) {
	tbl := &Table{Family: IPv4, Name: "t", Chains: []*Chain{{Name: "KUBE-SERVICES"}, {Name: "nat-prerouting"}},
		Fragments: map[string]*Fragment{"a": {Chains: []*Chain{{Name: "KUBE-SVC-A"}, {Name: "KUBE-SEP-A"}}}}}
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"KUBE-SEP-A", "KUBE-SERVICES"}, "[KUBE-SEP-A KUBE-SERVICES] true"},
		{[]string{"nat-prerouting"}, "[nat-prerouting] true"},
		{[]string{"KUBE-SVC-A", "rogue"}, "[KUBE-SVC-A <nil>] false"},
		{nil, "[] true"},
	} {
		got, ok := tbl.chainsNamed(tc.names)
		names := make([]any, len(got))
		for i, c := range got {
			names[i] = "<nil>"
			if c != nil {
				names[i] = c.Name
			}
		}
		if s := fmt.Sprintf("%v %v", names, ok); s != tc.want {
			t.Errorf("ChainsNamed(%v) = %v %v, want %s", tc.names, names, ok, tc.want)
		}
	}
}

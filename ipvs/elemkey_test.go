package ipvs

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// Every element a plan makes, and the edge cases of each field, packs
// into an elemKey and back unchanged, and distinct elements get distinct
// keys: the Syncer's maps are keyed by it.
func TestElemKeyRoundTrip(t *testing.T) {
	elems := BuildPlan(demoState(), Config{}, nodeAddrs).Elements()
	elems = append(elems,
		Element{},
		Element{Set: SetNodePortTCP, Port: 65535, V6: true},
		Element{Set: SetIPVSIPs, Addr: netip.MustParseAddr("::ffff:10.0.0.1"), V6: true},
		Element{Set: SetIPVSIPs, Addr: netip.MustParseAddr("10.0.0.1")},
		Element{Set: SetLBSourceCIDR, Addr: ip("10.0.0.1"), Protocol: model.SCTP, Port: 1, Net: netip.MustParsePrefix("0.0.0.0/0")},
		Element{Set: SetLBSourceCIDR, Addr: ip("2001:db8::1"), Protocol: model.TCP, Port: 1, Net: netip.MustParsePrefix("::/0"), V6: true},
		Element{Set: SetLBSourceCIDR, Addr: ip("2001:db8::1"), Protocol: model.TCP, Port: 1, Net: netip.MustParsePrefix("2001:db8::/128"), V6: true},
		Element{Set: SetLoopBack, Addr: ip("10.244.0.5"), Protocol: model.UDP, Port: 53, Addr2: ip("10.244.0.6")},
	)
	if len(elems) < 20 {
		t.Fatalf("only %d elements to check", len(elems))
	}
	keys := map[elemKey]Element{}
	keys4 := map[elemKey4]Element{}
	small := 0
	for _, e := range elems {
		k := e.key()
		if got := k.element(); got != e {
			t.Errorf("%+v came back as %+v", e, got)
		}
		if o, dup := keys[k]; dup && o != e {
			t.Errorf("%+v and %+v share a key", o, e)
		}
		keys[k] = e
		k4, ok := e.key4()
		if !ok {
			continue
		}
		small++
		if e.Addr.Is6() || e.Addr2.Is6() || e.Net.Addr().Is6() {
			t.Errorf("%+v has an IPv6 address but packs small", e)
		}
		if got := k4.element(); got != e {
			t.Errorf("%+v came back from 18 bytes as %+v", e, got)
		}
		if o, dup := keys4[k4]; dup && o != e {
			t.Errorf("%+v and %+v share a small key", o, e)
		}
		keys4[k4] = e
	}
	if small == 0 || small == len(elems) {
		t.Errorf("%d of %d elements pack small: want some, not all", small, len(elems))
	}
	// A fragment's packed lists unpack to its elements, sorted.
	p := packElements(elems)
	want := slices.Clone(elems)
	slices.SortFunc(want, compareElements)
	if got := p.all(); !slices.Equal(got, want) {
		t.Errorf("packed elements came back as\n%v\nwant\n%v", got, want)
	}
}

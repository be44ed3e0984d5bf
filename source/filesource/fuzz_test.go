package filesource

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
)

// fuzzMaxInput bounds the inputs FuzzDecodeState works on; larger ones
// tell nothing new and only slow the fuzzer down.
const fuzzMaxInput = 256 << 10

// FuzzDecodeState decodes YAML or JSON, feeds every object to a Builder and
// checks the State: nothing panics, and whatever the input, the State only
// holds what a backend can program. The seed corpus is in
// testdata/fuzz/FuzzDecodeState (the package's manifests and bad cases:
// binary junk, an alias bomb, tabs, IPv6 addresses in an IPv4 slice, a
// thousand ports).
//
//	go test ./source/filesource -run '^$' -fuzz FuzzDecodeState -fuzztime 1m
func FuzzDecodeState(f *testing.F) {
	for _, body := range manifests {
		f.Add([]byte(body))
	}
	dec, err := manifest.NewDecoder()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzMaxInput {
			return
		}
		objs, _ := dec.Decode(data, "fuzz.yaml")
		b := kube.NewBuilder("node-1")
		for _, o := range objs {
			_ = upsert(b, o.Obj)
		}
		st := b.State()
		checkState(t, st)
		// Upserting everything again changes nothing; removing it all
		// leaves nothing behind.
		for _, o := range objs {
			_ = upsert(b, o.Obj)
		}
		if again := b.State(); again.Services.Len() != st.Services.Len() || again.Endpoints.Len() != st.Endpoints.Len() {
			t.Errorf("upserting the same objects again changed the state: %d/%d services, %d/%d endpoints",
				again.Services.Len(), st.Services.Len(), again.Endpoints.Len(), st.Endpoints.Len())
		}
		for _, o := range objs {
			if ref, ok := refOf(o); ok {
				remove(b, ref)
			}
		}
		if empty := b.State(); empty.Services.Len() > 0 || empty.Endpoints.Len() > 0 {
			t.Errorf("state not empty after removing every object: %v", names(empty))
		}
	})
}

// checkState fails on anything in st a backend could not program.
func checkState(t *testing.T, st *model.State) {
	t.Helper()
	for n, sp := range st.Services.All() {
		switch {
		case sp == nil:
			t.Fatalf("%s: nil ServicePort", n)
		case sp.Name != n:
			t.Errorf("%s: ServicePort named %s", n, sp.Name)
		case !validServicePortName(n):
			t.Errorf("invalid service port name %q", n)
		case sp.Port == 0:
			t.Errorf("%s: port 0", n)
		}
		switch sp.Protocol {
		case model.TCP, model.UDP, model.SCTP:
		default:
			t.Errorf("%s: protocol %q", n, sp.Protocol)
		}
		for _, ip := range sp.ClusterIPs {
			if !ip.IsValid() || ip.Is4In6() || ip.Zone() != "" {
				t.Errorf("%s: cluster IP %v", n, ip)
			}
		}
		for _, ip := range append(slices.Clone(sp.ExternalIPs), sp.LoadBalancerIPs...) {
			if !ip.IsValid() || ip.Is4In6() || ip.Zone() != "" {
				t.Errorf("%s: external or load balancer IP %v", n, ip)
			}
		}
		for _, p := range sp.LoadBalancerSourceRanges {
			if !p.IsValid() || p != p.Masked() {
				t.Errorf("%s: source range %v", n, p)
			}
		}
	}
	for n, eps := range st.Endpoints.All() {
		if _, ok := st.Services.Lookup(n); !ok {
			t.Errorf("endpoints for %s, which is not in the state", n)
			continue
		}
		for _, ep := range eps {
			if !ep.Addr.IsValid() || ep.Addr.Is4In6() || ep.Addr.Zone() != "" || ep.Port == 0 {
				t.Errorf("%s: endpoint %v", n, ep)
			}
		}
	}
	sourcetest.CheckUniqueKeys(t, "fuzz", st)
}

// validServicePortName is what the API server lets through: DNS labels for
// the namespace, the name and the port's name (or no port name).
func validServicePortName(n model.ServicePortName) bool {
	return isDNSLabel(n.Namespace) && isDNSLabel(n.Name) && (n.Port == "" || isDNSLabel(n.Port))
}

func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// TestDecodeAliasBomb: a "billion laughs" document is refused by the YAML
// parser (go-yaml caps the share of nodes reached through aliases) before
// it costs much memory.
func TestDecodeAliasBomb(t *testing.T) {
	data := fuzzSeed(t, "alias-bomb")
	dec, err := manifest.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	objs, errs := dec.Decode(data, "bomb.yaml")
	runtime.ReadMemStats(&after)
	if len(objs) != 0 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "excessive aliasing") {
		t.Errorf("got %d objects, errors %v; want the document refused for excessive aliasing", len(objs), errs)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("decoding the bomb allocated %d MiB", alloc>>20)
	}
}

// fuzzSeed reads one seed of FuzzDecodeState's corpus.
func fuzzSeed(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzDecodeState", name))
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(raw), "\n")
	body = strings.TrimSuffix(strings.TrimSpace(body), ")")
	s, err := strconv.Unquote(strings.TrimPrefix(body, "[]byte("))
	if err != nil {
		t.Fatalf("seed %s: %v", name, err)
	}
	return []byte(s)
}

package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/proxier"
)

// The expected names are what iptables mode gives the same objects, so that an
// iptables-save dump and our ruleset can be compared chain by chain.
func TestChainNames(t *testing.T) {
	tests := []struct {
		name  proxier.ServicePortName
		proto proxier.Protocol
		want  string
	}{
		{proxier.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https"}, proxier.TCP, "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{proxier.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}, proxier.UDP, "KUBE-SVC-TCOU7JCQXEZGVUNU"},
	}
	for _, tt := range tests {
		if got := ServiceChain(tt.name, tt.proto); got != tt.want {
			t.Errorf("ServiceChain(%v, %v) = %s, want %s", tt.name, tt.proto, got, tt.want)
		}
	}
}

func TestChainNamesDifferByKindAndEndpoint(t *testing.T) {
	n := proxier.ServicePortName{Namespace: "ns", Name: "svc", Port: "p"}
	names := map[string]bool{
		ServiceChain(n, proxier.TCP):                  true,
		ServiceChain(n, proxier.UDP):                  true,
		ExternalChain(n, proxier.TCP):                 true,
		LocalServiceChain(n, proxier.TCP):             true,
		FirewallChain(n, proxier.TCP):                 true,
		EndpointChain(n, proxier.TCP, "10.0.0.1:80"):  true,
		EndpointChain(n, proxier.TCP, "10.0.0.2:80"):  true,
		EndpointChain(n, proxier.TCP, "[fd00::1]:80"): true,
	}
	if len(names) != 8 {
		t.Fatalf("names collide: %v", names)
	}
	for name := range names {
		if len(name) > 28 {
			t.Errorf("%s is longer than iptables' 28-character chain names", name)
		}
	}
}

// chainName is iptables mode's formula, written plainly here.
func TestChainNameFormula(t *testing.T) {
	hash16 := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return base32.StdEncoding.EncodeToString(sum[:])[:16]
	}
	long := strings.Repeat("n", 253)
	for _, n := range []proxier.ServicePortName{
		{Namespace: "default", Name: "kubernetes", Port: "https"},
		{Namespace: "ns", Name: "unnamed"},
		{Namespace: long, Name: long, Port: long},
	} {
		for _, proto := range []proxier.Protocol{proxier.TCP, proxier.UDP, proxier.SCTP, "Tcp\u00c9"} {
			for _, ep := range []string{"", "10.0.0.1:80", "[fd00::1]:8080"} {
				want := "KUBE-SEP-" + hash16(n.String()+proto.Lower()+ep)
				if got := chainName(prefixSEP, n, proto, ep); got != want {
					t.Errorf("chainName(%v, %q, %q) = %s, want %s", n, proto, ep, got, want)
				}
			}
		}
	}
}

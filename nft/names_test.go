package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
	"testing"

	"github.com/kube-nftproxy/kube-nftproxy/model"
)

// The expected names are what iptables mode gives the same objects, so that an
// iptables-save dump and our ruleset can be compared chain by chain.
func TestChainNames(t *testing.T) {
	tests := []struct {
		name  model.ServicePortName
		proto model.Protocol
		want  string
	}{
		{model.ServicePortName{Namespace: "default", Name: "kubernetes", Port: "https"}, model.TCP, "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{model.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}, model.UDP, "KUBE-SVC-TCOU7JCQXEZGVUNU"},
	}
	for _, tt := range tests {
		if got := ServiceChain(tt.name, tt.proto); got != tt.want {
			t.Errorf("ServiceChain(%v, %v) = %s, want %s", tt.name, tt.proto, got, tt.want)
		}
	}
}

func TestChainNamesDifferByKindAndEndpoint(t *testing.T) {
	n := model.ServicePortName{Namespace: "ns", Name: "svc", Port: "p"}
	names := map[string]bool{
		ServiceChain(n, model.TCP):                  true,
		ServiceChain(n, model.UDP):                  true,
		ExternalChain(n, model.TCP):                 true,
		LocalServiceChain(n, model.TCP):             true,
		FirewallChain(n, model.TCP):                 true,
		EndpointChain(n, model.TCP, "10.0.0.1:80"):  true,
		EndpointChain(n, model.TCP, "10.0.0.2:80"):  true,
		EndpointChain(n, model.TCP, "[fd00::1]:80"): true,
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
	for _, n := range []model.ServicePortName{
		{Namespace: "default", Name: "kubernetes", Port: "https"},
		{Namespace: "ns", Name: "unnamed"},
		{Namespace: long, Name: long, Port: long},
	} {
		for _, proto := range []model.Protocol{model.TCP, model.UDP, model.SCTP, "Tcp\u00c9"} {
			for _, ep := range []string{"", "10.0.0.1:80", "[fd00::1]:8080"} {
				want := "KUBE-SEP-" + hash16(n.String()+proto.Lower()+ep)
				if got := chainName(prefixSEP, n, proto, ep); got != want {
					t.Errorf("chainName(%v, %q, %q) = %s, want %s", n, proto, ep, got, want)
				}
			}
		}
	}
}

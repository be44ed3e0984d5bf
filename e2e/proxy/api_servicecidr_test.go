package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

// TestAPIServiceCIDRs: against a real API server, with the permissions of
// kube-proxy's system:node-proxier, the nftables mode drops traffic to the
// unallocated addresses of the API server's default ServiceCIDR (made from
// --service-cluster-ip-range) once it has synced, follows a ServiceCIDR
// created later, and rejects a port the kubernetes Service does not define.
func TestAPIServiceCIDRs(t *testing.T) {
	t.Parallel()
	a := newAPIEnv(t)
	chain := func(ctx context.Context, family string) (string, error) {
		out, err := a.sb.Exec(ctx, sandbox.Node, "nft", "list", "chain", family, "kube-nftproxy", "cluster-ips-check")
		return string(out), err
	}
	// The proxy has synced once newAPIEnv returns.
	for family, rule := range map[string]string{"ip": "ip daddr 10.96.0.0/16 drop", "ip6": "ip6 daddr fd00:10:96::/112 drop"} {
		if out, err := chain(t.Context(), family); err != nil || !strings.Contains(out, rule) {
			t.Errorf("%s cluster-ips-check after the first sync lacks %q (%v):\n%s", family, rule, err, out)
		}
	}
	edgeExpectDropped(t, a.env, podC.Name, "tcp", "10.96.0.200:80")
	edgeExpectRefused(t, a.env, podC.Name, "tcp", "10.96.0.1:444") // the kubernetes Service defines 443 only

	sc := &networkingv1.ServiceCIDR{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "ServiceCIDR"},
		ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/24"}},
	}
	a.do(t, "POST", "/apis/networking.k8s.io/v1/servicecidrs", sc, nil)
	a.proxy.poll(t, 20*time.Second, "the new ServiceCIDR's drop rule", func(ctx context.Context) error {
		out, err := chain(ctx, "ip")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "ip daddr 10.100.0.0/24 drop") {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})
	edgeExpectDropped(t, a.env, podC.Name, "udp", "10.100.0.7:53")
}

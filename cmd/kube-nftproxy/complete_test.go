package main

import (
	"bytes"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/internal/ipvsnl"
	"github.com/kube-nftproxy/kube-nftproxy/ipvs"
	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
)

// TestGateAllowServiceExternalIPs: the effective AllowServiceExternalIPs,
// from --feature-gates or --config's featureGates (which complete merges),
// decides whether the Builder made with modelOptions programs a Service's
// external IPs (in the State, and so in IPVS mode's plan, which no kernel
// here can run); the gate is honoured, so no warning says it has no effect,
// and the Builder's note goes to the log given.
func TestGateAllowServiceExternalIPs(t *testing.T) {
	tests := []struct {
		name      string
		flag      string
		fileGates map[string]bool
		want      bool
	}{
		{name: "default", want: true},
		{name: "flag false", flag: gateExternalIPs + "=false", want: false},
		{name: "flag true", flag: gateExternalIPs + "=true", want: true},
		{name: "config false", fileGates: map[string]bool{gateExternalIPs: false}, want: false},
		{name: "another gate only", flag: "LoggingAlphaOptions=true", want: true},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.5", ExternalIPs: []string{"192.0.2.50"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}
	extIP := netip.MustParseAddr(svc.Spec.ExternalIPs[0])
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := &options{featureGates: tt.flag, fileGates: tt.fileGates}
			if err := o.complete(); err != nil {
				t.Fatal(err)
			}
			if got := gateEnabled(o.gates, gateExternalIPs); got != tt.want {
				t.Errorf("gateEnabled = %t, want %t", got, tt.want)
			}
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			o.noteGates(log)
			if strings.Contains(logged.String(), "no effect") {
				t.Errorf("noteGates warned: %s", logged.String())
			}
			b := kube.NewBuilder("node-1", modelOptions(o.gates, log)...)
			if err := b.UpsertService(svc); err != nil {
				t.Fatal(err)
			}
			p := b.State().Services.Get(model.ServicePortName{Namespace: "default", Name: "ext", Port: "http"})
			if p == nil {
				t.Fatal("default/ext:http is not in the State")
			}
			if got := len(p.ExternalIPs) > 0; got != tt.want {
				t.Errorf("external IPs programmed: %t (%v), want %t", got, p.ExternalIPs, tt.want)
			}
			if noted := strings.Contains(logged.String(), "AllowServiceExternalIPs is disabled"); noted == tt.want {
				t.Errorf("log noted ignored external IPs: %t, want %t:\n%s", noted, !tt.want, logged.String())
			}
			if got := ipvsPlanHas(b.State(), extIP); got != tt.want {
				t.Errorf("IPVS mode's plan has %v: %t, want %t", extIP, got, tt.want)
			}
		})
	}
}

// ipvsPlanHas reports whether IPVS mode's plan of st has a virtual server,
// a kube-ipvs0 address or a helper set element for addr.
func ipvsPlanHas(st *model.State, addr netip.Addr) bool {
	for _, fr := range ipvs.BuildPlan(st, ipvs.Config{}, nil).Services {
		if slices.Contains(fr.Addrs, addr) ||
			slices.ContainsFunc(fr.Virtual, func(v ipvsnl.VirtualServer) bool { return v.Addr == addr }) ||
			slices.ContainsFunc(fr.Elements(), func(e ipvs.Element) bool { return e.Addr == addr }) {
			return true
		}
	}
	return false
}

package kube

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

// TestServicePortsExternalIPsGate: with the gate AllowServiceExternalIPs on,
// external IPs are programmed as always; with it off, none is, the Service
// reads as one without external IPs (its eTP Local on a ClusterIP Service
// means nothing, a load balancer IP that is also an external IP stays), and
// the valid ones come back as ignored.
func TestServicePortsExternalIPsGate(t *testing.T) {
	const head = `
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default}
spec:
`
	tests := []struct {
		name        string
		spec        string
		on, off     func(*model.ServicePort)
		ignored     []string
		errsOn      []string
		errsOff     []string
		noPortsEver bool
	}{{
		name: "dual-stack external IPs",
		spec: `  clusterIPs: [10.96.0.5, "fd00::5"]
  externalIPs: [192.0.2.50, "2001:db8::50"]
  ports: [{name: http, port: 80}]`,
		on:      func(p *model.ServicePort) { p.ExternalIPs = sourcetest.Addrs("192.0.2.50", "2001:db8::50") },
		ignored: []string{"192.0.2.50", "2001:db8::50"},
	}, {
		name: "eTP Local on a ClusterIP Service counts only with external IPs",
		spec: `  clusterIP: 10.96.0.5
  externalTrafficPolicy: Local
  externalIPs: [192.0.2.50]
  ports: [{name: http, port: 80}]`,
		on: func(p *model.ServicePort) {
			p.ExternalIPs = sourcetest.Addrs("192.0.2.50")
			p.ExternalPolicyLocal = true
		},
		ignored: []string{"192.0.2.50"},
	}, {
		name: "a load balancer IP that is also an external IP is kept when external IPs are not",
		spec: `  type: LoadBalancer
  clusterIP: 10.96.0.5
  externalIPs: [192.0.2.50]
  ports: [{name: http, port: 80}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.50}]}`,
		on:      func(p *model.ServicePort) { p.ExternalIPs = sourcetest.Addrs("192.0.2.50") },
		off:     func(p *model.ServicePort) { p.LoadBalancerIPs = sourcetest.Addrs("192.0.2.50") },
		ignored: []string{"192.0.2.50"},
		errsOn:  []string{"status.loadBalancer.ingress ip: 192.0.2.50 is also the Service's external IP, dropped"},
	}, {
		name: "bad and repeated addresses: reported either way, ignored once",
		spec: `  clusterIP: 10.96.0.5
  externalIPs: [192.0.2.50, nonsense, 192.0.2.50, 10.96.0.5]
  ports: [{name: http, port: 80}]`,
		on:      func(p *model.ServicePort) { p.ExternalIPs = sourcetest.Addrs("192.0.2.50") },
		ignored: []string{"192.0.2.50", "10.96.0.5"},
		errsOn:  []string{`spec.externalIPs[1]`, "spec.externalIPs: 10.96.0.5 is also the Service's cluster IP, dropped"},
		errsOff: []string{`spec.externalIPs[1]`},
	}, {
		name: "no external IPs: nothing ignored",
		spec: `  clusterIP: 10.96.0.5
  ports: [{name: http, port: 80}]`,
	}, {
		name: "a Service kube-proxy ignores has nothing to ignore",
		spec: `  clusterIP: None
  externalIPs: [192.0.2.50]
  ports: [{name: http, port: 80}]`,
		noPortsEver: true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := sourcetest.DecodeService(t, head+tt.spec)
			for _, drop := range []bool{false, true} {
				ports, ignored, err := servicePorts(svc, drop)
				if tt.noPortsEver {
					if ports != nil || ignored != nil || err != nil {
						t.Errorf("drop=%t: got %v, %v, %v; want nothing", drop, ports, ignored, err)
					}
					continue
				}
				want, change, wantIgnored, wantErrs := expectedPort(svc), tt.on, []string(nil), tt.errsOn
				if drop {
					change, wantIgnored, wantErrs = tt.off, tt.ignored, tt.errsOff
				}
				if change != nil {
					change(want)
				}
				sourcetest.MustEqual(t, "ports", ports, []*model.ServicePort{want})
				if w := sourcetest.Addrs(wantIgnored...); !slices.Equal(ignored, w) {
					t.Errorf("drop=%t: ignored %v, want %v", drop, ignored, w)
				}
				sourcetest.CheckErrors(t, SplitErrors(err), wantErrs...)
			}
		})
	}
}

// expectedPort is the ServicePort of the one port of the tests' Service
// ext: its cluster IPs and, for a LoadBalancer, its type's defaults.
func expectedPort(svc *corev1.Service) *model.ServicePort {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	return sp("ext", "http", model.TCP, 80, ips...)
}

// recordLog is a slog handler keeping each record's message and
// attributes as "msg k=v k=v".
type recordLog struct {
	mu    sync.Mutex
	lines []string
}

func (r *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordLog) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recordLog) WithGroup(string) slog.Handler            { return r }
func (r *recordLog) Handle(_ context.Context, rec slog.Record) error {
	var b bytes.Buffer
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
	return nil
}

// take returns the lines logged since the last call.
func (r *recordLog) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	return out
}

// TestBuilderExternalIPsGate drives a Builder with the gate off through a
// Service's life: its external IPs never reach the State, no conflict is
// resolved over them, and the note is logged once per change of the
// Service (or of its external IPs), never for a resync. With the gate on
// nothing is logged and the external IPs are programmed.
func TestBuilderExternalIPsGate(t *testing.T) {
	const ext = `
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: default, labels: {app: ext}}
spec:
  clusterIP: 10.96.0.5
  externalIPs: [192.0.2.50]
  ports: [{name: http, port: 80}]`
	const note = msgExternalIPsIgnored + " service=default/ext externalIPs="
	base := sourcetest.DecodeService(t, ext)
	edit := func(f func(*corev1.Service)) *corev1.Service {
		svc := base.DeepCopy()
		f(svc)
		return svc
	}
	rival := edit(func(s *corev1.Service) { s.Name, s.Spec.ClusterIP = "rival", "10.96.0.6" })
	steps := []struct {
		name     string
		do       func(b *Builder) error
		wantLogs []string // with the gate off; on, never any
	}{
		{"added", func(b *Builder) error { return b.UpsertService(base) }, []string{note + "[192.0.2.50]"}},
		{"resync", func(b *Builder) error { return b.UpsertService(base.DeepCopy()) }, nil},
		{"a label changes", func(b *Builder) error {
			return b.UpsertService(edit(func(s *corev1.Service) { s.Labels["app"] = "other" }))
		}, nil},
		{"a rival asks for the same external IP", func(b *Builder) error { return b.UpsertService(rival) }, []string{
			msgExternalIPsIgnored + " service=default/rival externalIPs=[192.0.2.50]"}},
		{"the external IPs change", func(b *Builder) error {
			return b.UpsertService(edit(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.51", "192.0.2.50"} }))
		}, []string{note + "[192.0.2.51 192.0.2.50]"}},
		{"the port changes", func(b *Builder) error {
			return b.UpsertService(edit(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.51", "192.0.2.50"}
				s.Spec.Ports[0].Port = 81
			}))
		}, []string{note + "[192.0.2.51 192.0.2.50]"}},
		{"deleted", func(b *Builder) error { b.DeleteService("default", "ext"); return nil }, nil},
		{"added again", func(b *Builder) error { return b.UpsertService(base) }, []string{note + "[192.0.2.50]"}},
		{"the external IPs go", func(b *Builder) error {
			return b.UpsertService(edit(func(s *corev1.Service) { s.Spec.ExternalIPs = nil }))
		}, nil},
	}
	for _, allowed := range []bool{true, false} {
		rec := &recordLog{}
		b := NewBuilder("node-1", AllowExternalIPs(allowed, slog.New(rec)))
		for _, step := range steps {
			if err := step.do(b); err != nil {
				t.Fatalf("allowed=%t, %s: %v", allowed, step.name, err)
			}
			want := step.wantLogs
			if allowed {
				want = nil
			}
			sourcetest.MustEqual(t, fmt.Sprintf("allowed=%t, %s: logged", allowed, step.name), rec.take(), want)
			st := b.State()
			var programmed []string
			for _, p := range st.Services.All() {
				for _, ip := range p.ExternalIPs {
					programmed = append(programmed, p.Name.String()+" "+ip.String())
				}
			}
			if !allowed && len(programmed) > 0 {
				t.Errorf("gate off, %s: external IPs in the State: %v", step.name, programmed)
			}
			if conflicts := b.ConflictErrors(); !allowed && len(conflicts) > 0 {
				t.Errorf("gate off, %s: conflicts over ignored addresses: %v", step.name, conflicts)
			}
		}
	}
}

// TestBuilderExternalIPsGateOn: with the gate on (and without options) the
// external IPs are in the State and two Services asking for one still
// conflict, as before.
func TestBuilderExternalIPsGateOn(t *testing.T) {
	for _, b := range []*Builder{NewBuilder("node-1"), NewBuilder("node-1", AllowExternalIPs(true, nil))} {
		ext := sourcetest.DecodeService(t, strings.Replace(sourcetest.WebService, "  ports:", "  externalIPs: [192.0.2.50]\n  ports:", 1))
		if err := b.UpsertService(ext); err != nil {
			t.Fatal(err)
		}
		rival := ext.DeepCopy()
		// Later in name order: the conflict leaves web the address.
		rival.Name, rival.Spec.ClusterIP = "x-rival", "10.96.0.6"
		if err := b.UpsertService(rival); err != nil {
			t.Fatal(err)
		}
		p := b.State().Services.Get(sourcetest.WebPortName("http"))
		if p == nil {
			t.Fatal("default/web:http is not in the State")
		}
		sourcetest.MustEqual(t, "external IPs", p.ExternalIPs, sourcetest.Addrs("192.0.2.50"))
		if len(b.ConflictErrors()) != 1 {
			t.Errorf("conflicts: %v; want the rival's one", b.ConflictErrors())
		}
	}
}

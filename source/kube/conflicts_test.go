package kube

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

var conflictEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// csvc is LoadBalancer Service default/<name> created <created> seconds
// after conflictEpoch, with one port http TCP/80 unless opts say otherwise.
func csvc(name string, created int, clusterIP string, opts ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name,
		},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeLoadBalancer,
			ClusterIPs: strings.Split(clusterIP, ","),
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		},
	}
	if created >= 0 { // <0: none, as in a hand-written state file
		svc.CreationTimestamp = metav1.NewTime(conflictEpoch.Add(time.Duration(created) * time.Second))
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

func inNamespace(ns string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Namespace = ns }
}

// nodePort sets the node port of the first port.
func nodePort(np int32) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports[0].NodePort = np }
}

func withPorts(ports ...corev1.ServicePort) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

func externalIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func lbIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

// conflictStep upserts a Service (and more, before the snapshot) or, with
// del set, deletes <delNS or default>/<del>.
type conflictStep struct {
	upsert *corev1.Service
	more   []*corev1.Service
	del    string
	delNS  string
	want   []string // summarize of the state after the step
	errs   []string // what Errors reports after the step
}

func TestBuilderConflicts(t *testing.T) {
	tests := []struct {
		name  string
		steps []conflictStep
	}{{
		name: "same NodePort: an older Service arriving takes it, as a restart would give it; the other gets it back when it goes",
		steps: []conflictStep{{
			upsert: csvc("a", 2, "10.96.0.1", nodePort(30080)),
			want:   []string{"default/a:http TCP/80 cluster=10.96.0.1 np=30080"},
		}, {
			upsert: csvc("b", 1, "10.96.0.2", nodePort(30080)),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1",
				"default/b:http TCP/80 cluster=10.96.0.2 np=30080",
			},
			errs: []string{`service default/a: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/b port "http", which keeps it; dropped`},
		}, {
			del:  "b",
			want: []string{"default/a:http TCP/80 cluster=10.96.0.1 np=30080"},
		}},
	}, {
		name: "same NodePort: a newer Service arriving does not take it",
		steps: []conflictStep{{
			upsert: csvc("b", 1, "10.96.0.2", nodePort(30080)),
		}, {
			upsert: csvc("a", 2, "10.96.0.1", nodePort(30080)),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1",
				"default/b:http TCP/80 cluster=10.96.0.2 np=30080",
			},
			errs: []string{`service default/a: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/b port "http", which keeps it; dropped`},
		}},
	}, {
		name: "same NodePort arriving together: the older Service keeps it",
		steps: []conflictStep{{
			upsert: csvc("a", 2, "10.96.0.1", nodePort(30080)),
			more:   []*corev1.Service{csvc("b", 1, "10.96.0.2", nodePort(30080))},
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1",
				"default/b:http TCP/80 cluster=10.96.0.2 np=30080",
			},
			errs: []string{`service default/a: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/b port "http", which keeps it; dropped`},
		}},
	}, {
		name: "a NodePort collides only within an IP family; the loser keeps the rest",
		steps: []conflictStep{{
			upsert: csvc("v4", 1, "10.96.0.1", nodePort(30080)),
		}, {
			upsert: csvc("v6", 2, "fd00::2", nodePort(30080)),
			want: []string{
				"default/v4:http TCP/80 cluster=10.96.0.1 np=30080",
				"default/v6:http TCP/80 cluster=fd00::2 np=30080",
			},
		}, {
			// The holder is dual-stack: a newcomer of either family loses
			// only the NodePort, nothing of the holder changes.
			upsert: csvc("dual", 0, "10.96.0.3,fd00::3", nodePort(30081), externalIPs("192.0.2.1")),
		}, {
			upsert: csvc("late", 0, "10.96.0.4", nodePort(30081), externalIPs("192.0.2.2")),
			want: []string{
				"default/dual:http TCP/80 cluster=10.96.0.3,fd00::3 ext=192.0.2.1 np=30081",
				"default/late:http TCP/80 cluster=10.96.0.4 ext=192.0.2.2",
				"default/v4:http TCP/80 cluster=10.96.0.1 np=30080",
				"default/v6:http TCP/80 cluster=fd00::2 np=30080",
			},
			errs: []string{`service default/late: port "http": NodePort 30081/TCP conflicts with the NodePort of service default/dual port "http", which keeps it; dropped`},
		}},
	}, {
		name: "one NodePort on two protocols is no conflict",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30053)),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", withPorts(corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053})),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 np=30053",
				"default/b:dns UDP/53 cluster=10.96.0.2 np=30053",
			},
		}},
	}, {
		name: "same creation time: namespace, then name, decide",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", inNamespace("team-b"), externalIPs("192.0.2.1")),
			more: []*corev1.Service{
				csvc("z", 1, "10.96.0.2", inNamespace("team-a"), externalIPs("192.0.2.1")),
				csvc("y", 1, "10.96.0.3", inNamespace("team-a"), externalIPs("192.0.2.1")),
			},
			want: []string{
				"team-a/y:http TCP/80 cluster=10.96.0.3 ext=192.0.2.1",
				"team-a/z:http TCP/80 cluster=10.96.0.2",
				"team-b/a:http TCP/80 cluster=10.96.0.1",
			},
			errs: []string{
				`service team-a/z: port "http": external IP 192.0.2.1:80/TCP conflicts with the external IP of service team-a/y port "http", which keeps it; dropped`,
				`service team-b/a: port "http": external IP 192.0.2.1:80/TCP conflicts with the external IP of service team-a/y port "http", which keeps it; dropped`,
			},
		}, {
			// Neither rival held it: the rank decides again.
			delNS: "team-a", del: "y",
			want: []string{
				"team-a/z:http TCP/80 cluster=10.96.0.2 ext=192.0.2.1",
				"team-b/a:http TCP/80 cluster=10.96.0.1",
			},
			errs: []string{`service team-b/a: port "http": external IP 192.0.2.1:80/TCP conflicts with the external IP of service team-a/z port "http", which keeps it; dropped`},
		}},
	}, {
		name: "address kinds mix: an external IP on another Service's cluster IP and port",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1"),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", externalIPs("10.96.0.1", "192.0.2.1")),
			errs:   []string{`service default/b: port "http": external IP 10.96.0.1:80/TCP conflicts with the cluster IP of service default/a`},
		}, {
			// The same address on another port is no conflict.
			upsert: csvc("c", 3, "10.96.0.3", externalIPs("10.96.0.1"), withPorts(corev1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443})),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1",
				"default/b:http TCP/80 cluster=10.96.0.2 ext=192.0.2.1",
				"default/c:https TCP/443 cluster=10.96.0.3 ext=10.96.0.1",
			},
			errs: []string{`service default/b: port "http": external IP 10.96.0.1:80/TCP conflicts with the cluster IP of service default/a port "http", which keeps it; dropped`},
		}},
	}, {
		name: "a cluster IP is never taken by an older Service's external IP",
		steps: []conflictStep{{
			upsert: csvc("new", 2, "10.96.0.9,fd00::9"),
		}, {
			upsert: csvc("old", 1, "10.96.0.1", externalIPs("10.96.0.9")),
			want: []string{
				"default/new:http TCP/80 cluster=10.96.0.9,fd00::9",
				"default/old:http TCP/80 cluster=10.96.0.1",
			},
			errs: []string{`service default/old: port "http": external IP 10.96.0.9:80/TCP conflicts with the cluster IP of service default/new port "http", which keeps it; dropped`},
		}},
	}, {
		name: "three Services on one load balancer IP: the next in rank takes over",
		steps: []conflictStep{{
			upsert: csvc("c", 3, "10.96.0.3", lbIPs("203.0.113.1")),
			more: []*corev1.Service{
				csvc("b", 2, "10.96.0.2", externalIPs("203.0.113.1")),
				csvc("a", 1, "10.96.0.1", lbIPs("203.0.113.1")),
			},
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 lb=203.0.113.1",
				"default/b:http TCP/80 cluster=10.96.0.2",
				"default/c:http TCP/80 cluster=10.96.0.3",
			},
			errs: []string{
				`service default/b: port "http": external IP 203.0.113.1:80/TCP conflicts with the load balancer IP of service default/a port "http", which keeps it; dropped`,
				`service default/c: port "http": load balancer IP 203.0.113.1:80/TCP conflicts with the load balancer IP of service default/a port "http", which keeps it; dropped`,
			},
		}, {
			del: "a",
			want: []string{
				"default/b:http TCP/80 cluster=10.96.0.2 ext=203.0.113.1",
				"default/c:http TCP/80 cluster=10.96.0.3",
			},
			errs: []string{`service default/c: port "http": load balancer IP 203.0.113.1:80/TCP conflicts with the external IP of service default/b port "http", which keeps it; dropped`},
		}, {
			upsert: csvc("b", 2, "10.96.0.2"),
			want: []string{
				"default/b:http TCP/80 cluster=10.96.0.2",
				"default/c:http TCP/80 cluster=10.96.0.3 lb=203.0.113.1",
			},
		}},
	}, {
		name: "the holder changing its value hands the old one over",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30080)),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", nodePort(30080)),
			errs:   []string{`service default/b: port "http": NodePort 30080/TCP conflicts`},
		}, {
			// A change elsewhere in the holder keeps its hold.
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30080), externalIPs("192.0.2.1")),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 ext=192.0.2.1 np=30080",
				"default/b:http TCP/80 cluster=10.96.0.2",
			},
			errs: []string{`service default/b: port "http": NodePort 30080/TCP conflicts`},
		}, {
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30081)),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 np=30081",
				"default/b:http TCP/80 cluster=10.96.0.2 np=30080",
			},
		}},
	}, {
		name: "a Service replaced (a new creation time) ranks by it: the older rival takes the value",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30080)),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", nodePort(30080)),
			errs:   []string{`service default/b: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/a`},
		}, {
			// A missed delete: the new object arrives as an update.
			upsert: csvc("a", 3, "10.96.0.1", nodePort(30080)),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1",
				"default/b:http TCP/80 cluster=10.96.0.2 np=30080",
			},
			errs: []string{`service default/a: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/b port "http"`},
		}},
	}, {
		name: "a loser that moves off the value is clean; one going away no longer counts",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", externalIPs("192.0.2.1")),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", externalIPs("192.0.2.1")),
			errs:   []string{`service default/b: port "http": external IP 192.0.2.1:80/TCP conflicts`},
		}, {
			upsert: csvc("b", 2, "10.96.0.2", externalIPs("192.0.2.2")),
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 ext=192.0.2.1",
				"default/b:http TCP/80 cluster=10.96.0.2 ext=192.0.2.2",
			},
		}, {
			upsert: csvc("c", 3, "10.96.0.3", externalIPs("192.0.2.2")),
			errs:   []string{`service default/c: port "http": external IP 192.0.2.2:80/TCP conflicts with the external IP of service default/b`},
		}, {
			del: "c",
			want: []string{
				"default/a:http TCP/80 cluster=10.96.0.1 ext=192.0.2.1",
				"default/b:http TCP/80 cluster=10.96.0.2 ext=192.0.2.2",
			},
		}},
	}, {
		name: "an ignored or invalid update lets go of the values",
		steps: []conflictStep{{
			upsert: csvc("a", 1, "10.96.0.1", nodePort(30080)),
		}, {
			upsert: csvc("b", 2, "10.96.0.2", nodePort(30080)),
			errs:   []string{`service default/b: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/a`},
		}, {
			upsert: csvc("a", 1, "None"),
			want:   []string{"default/b:http TCP/80 cluster=10.96.0.2 np=30080"},
		}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBuilder("node-1")
			for i, s := range tt.steps {
				what := fmt.Sprintf("step %d", i)
				if s.del != "" {
					b.DeleteService(cmp.Or(s.delNS, "default"), s.del)
				} else {
					for _, svc := range append([]*corev1.Service{s.upsert}, s.more...) {
						if err := b.UpsertService(svc); err != nil {
							t.Fatalf("%s: %v", what, err)
						}
					}
				}
				st := b.State()
				if s.want != nil {
					sourcetest.MustEqual(t, what+": services", sourcetest.Summarize(st), s.want)
				}
				sourcetest.CheckErrors(t, b.Errors(), s.errs...)
				sourcetest.CheckUniqueKeys(t, what, st)
				for _, err := range b.Errors() {
					var ce *ConflictError
					if !errors.As(err, &ce) {
						t.Errorf("%s: %v is not a ConflictError", what, err)
					}
				}
			}
		})
	}
}

// TestBuilderConflictsOrderFree feeds the same Services in every order: the
// state and the reports must not depend on it, as a restart must agree
// with a proxy that saw the objects arrive one by one.
func TestBuilderConflictsOrderFree(t *testing.T) {
	svcs := []*corev1.Service{
		csvc("a", 1, "10.96.0.1", nodePort(30080), externalIPs("192.0.2.1")),
		csvc("b", 1, "10.96.0.2", nodePort(30080), lbIPs("192.0.2.1")),
		csvc("c", 0, "10.96.0.3", externalIPs("10.96.0.1")),
		csvc("d", 2, "10.96.0.4", nodePort(30081), lbIPs("192.0.2.1", "10.96.0.3")),
	}
	wantState := []string{
		"default/a:http TCP/80 cluster=10.96.0.1 ext=192.0.2.1 np=30080",
		"default/b:http TCP/80 cluster=10.96.0.2",
		"default/c:http TCP/80 cluster=10.96.0.3",
		"default/d:http TCP/80 cluster=10.96.0.4 np=30081",
	}
	wantErrs := []string{
		`service default/c: port "http": external IP 10.96.0.1:80/TCP conflicts with the cluster IP of service default/a port "http"`,
		`service default/b: port "http": load balancer IP 192.0.2.1:80/TCP conflicts with the external IP of service default/a port "http"`,
		`service default/b: port "http": NodePort 30080/TCP conflicts with the NodePort of service default/a port "http"`,
		`service default/d: port "http": load balancer IP 192.0.2.1:80/TCP conflicts with the external IP of service default/a port "http"`,
		`service default/d: port "http": load balancer IP 10.96.0.3:80/TCP conflicts with the cluster IP of service default/c port "http"`,
	}
	var first []string
	for order := range permutations(len(svcs)) {
		b := NewBuilder("node-1")
		for _, i := range order {
			if err := b.UpsertService(svcs[i]); err != nil {
				t.Fatal(err)
			}
		}
		what := fmt.Sprintf("order %v", order)
		sourcetest.MustEqual(t, what, sourcetest.Summarize(b.State()), wantState)
		sourcetest.CheckErrors(t, b.Errors(), wantErrs...)
		msgs := errorStrings(b.Errors())
		if first == nil {
			first = msgs
		}
		sourcetest.MustEqual(t, what+": errors in the same order", msgs, first)
	}
}

// permutations yields every order of 0..n-1 (Heap's algorithm).
func permutations(n int) func(func([]int) bool) {
	return func(yield func([]int) bool) {
		p := make([]int, n)
		for i := range p {
			p[i] = i
		}
		c := make([]int, n)
		if !yield(slices.Clone(p)) {
			return
		}
		for i := 0; i < n; {
			if c[i] < i {
				if i%2 == 0 {
					p[0], p[i] = p[i], p[0]
				} else {
					p[c[i]], p[i] = p[i], p[c[i]]
				}
				if !yield(slices.Clone(p)) {
					return
				}
				c[i]++
				i = 0
			} else {
				c[i] = 0
				i++
			}
		}
	}
}

func errorStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}

// TestBuilderConflictsIncremental drives one Builder through random
// upserts and deletes of Services that fight over a few values, and after
// every snapshot checks the rules against the objects alone: no key is in
// the state twice, every address some Service asks for is in it, and the
// state and the reports are those of a Builder given the same objects at
// once, as a restarted proxy or render is: a restart never moves a value.
func TestBuilderConflictsIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(vals ...string) string { return vals[rng.IntN(len(vals))] }
	random := func(i int) *corev1.Service {
		var opts []func(*corev1.Service)
		if rng.IntN(2) == 0 {
			opts = append(opts, nodePort(int32(30080+rng.IntN(3))))
		}
		if rng.IntN(2) == 0 {
			opts = append(opts, externalIPs(pick("192.0.2.1", "192.0.2.2", "10.96.0.1")))
		}
		if rng.IntN(2) == 0 {
			opts = append(opts, lbIPs(pick("192.0.2.1", "192.0.2.3", "10.96.0.2")))
		}
		if rng.IntN(3) == 0 {
			opts = append(opts, withPorts(
				corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: int32(30080 + rng.IntN(3))},
				corev1.ServicePort{Name: "alt", Protocol: corev1.ProtocolTCP, Port: int32(80 + rng.IntN(2)*363)},
			))
		}
		ip := pick(fmt.Sprintf("10.96.0.%d", 10+i), "10.96.0.1", "10.96.0.2")
		return csvc(fmt.Sprintf("s%d", i), rng.IntN(4)-1, ip, opts...)
	}

	b := NewBuilder("node-1")
	live := map[string]*corev1.Service{}
	compared, conflicted := 0, 0
	for step := range 2000 {
		i := rng.IntN(8)
		name := fmt.Sprintf("s%d", i)
		if rng.IntN(4) == 0 {
			b.DeleteService("default", name)
			delete(live, name)
		} else {
			svc := random(i)
			_ = b.UpsertService(svc) // a duplicate address in one Service is reported; fine here
			live[name] = svc
		}
		if rng.IntN(3) > 0 {
			continue // several changes between snapshots, too
		}
		what := fmt.Sprintf("step %d", step)
		got := b.State()
		sourcetest.CheckUniqueKeys(t, what, got)
		held := stateClaims(got)
		restarted := NewBuilder("node-1")
		for _, name := range slices.Sorted(maps.Keys(live)) {
			_ = restarted.UpsertService(live[name])
			ports, _ := ServicePorts(live[name])
			for _, u := range newServiceEntry(serviceKey{"default", name}, time.Time{}, ports).claims {
				if _, ok := held[u.key]; !ok && u.key.addr.IsValid() {
					// (A NodePort can go unheld: a dual-stack port losing it
					// in one family loses it in both, the model having one
					// NodePort.)
					t.Errorf("%s: %s is asked for by %s but nobody holds it", what, u.key, name)
				}
			}
		}
		sourcetest.MustEqual(t, what+": the running Builder against one given the same objects at once",
			sourcetest.Summarize(got), sourcetest.Summarize(restarted.State()))
		sourcetest.MustEqual(t, what+": reports", errorStrings(b.Errors()), errorStrings(restarted.Errors()))
		if t.Failed() {
			t.FailNow()
		}
		compared++
		if len(b.Errors()) > 0 {
			conflicted++
		}
	}
	// Guard the test's own worth: most snapshots should hold conflicts.
	if conflicted < compared/2 {
		t.Errorf("only %d of %d snapshots had conflicts", conflicted, compared)
	}
}

// stateClaims lists the keys in a state with the Service holding each.
func stateClaims(st *model.State) map[claim]string {
	out := map[claim]string{}
	for _, sp := range st.Services.All() {
		for _, ips := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
			for _, ip := range ips {
				out[claim{addr: ip, proto: sp.Protocol, port: sp.Port}] = sp.Name.Name
			}
		}
		if sp.NodePort != 0 {
			for _, c := range programmedNodePortClaims(sp) {
				out[c] = sp.Name.Name
			}
		}
	}
	return out
}

// An older Service listing another's cluster IP as its external IP does not
// take the cluster IP over.
func TestClusterIPKeepsItsAddress(t *testing.T) {
	b := NewBuilder("node-1")
	older := svcWithExternalIP(t, "old", "10.96.0.10", time.Unix(100, 0))
	newer := svcWithClusterIP(t, "new", "10.96.0.10", time.Unix(200, 0))
	for _, s := range []*corev1.Service{older, newer} {
		if err := b.UpsertService(s); err != nil {
			t.Fatal(err)
		}
	}
	st := b.State()
	n := model.ServicePortName{Namespace: "default", Name: "new", Port: "http"}
	if sp := st.Services.Get(n); sp == nil || len(sp.ClusterIPs) != 1 {
		t.Fatalf("the newer Service lost its cluster IP: %+v", sp)
	}
	o := model.ServicePortName{Namespace: "default", Name: "old", Port: "http"}
	if sp := st.Services.Get(o); sp == nil || len(sp.ExternalIPs) != 0 {
		t.Errorf("the older Service kept the external IP that is another's cluster IP: %+v", sp)
	}
}

func svcWithClusterIP(t *testing.T, name, ip string, created time.Time) *corev1.Service {
	t.Helper()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
}

func svcWithExternalIP(t *testing.T, name, extIP string, created time.Time) *corev1.Service {
	t.Helper()
	s := svcWithClusterIP(t, name, "10.96.0.99", created)
	s.Spec.ExternalIPs = []string{extIP}
	return s
}

// A dual-stack newcomer asking for a NodePort that an IPv4-only Service
// holds loses it in IPv4 only: its IPv6 NodePort had no conflict.
func TestNodePortConflictIsPerFamily(t *testing.T) {
	b := NewBuilder("node-1")
	if err := b.UpsertService(csvc("holder", 0, "10.96.0.10", nodePort(30080))); err != nil {
		t.Fatal(err)
	}
	b.State() // the holder is programmed first
	_ = b.UpsertService(csvc("newcomer", 0, "10.96.0.11,fd00:10:96::11", nodePort(30080)))
	st := b.State()
	holder := st.Services.Get(model.ServicePortName{Namespace: "default", Name: "holder", Port: "http"})
	newcomer := st.Services.Get(model.ServicePortName{Namespace: "default", Name: "newcomer", Port: "http"})
	if holder == nil || newcomer == nil {
		t.Fatalf("services missing from the state: %v", st.Services)
	}
	if holder.NodePortIn(false) != 30080 {
		t.Errorf("the holder's IPv4 NodePort is %d, want 30080", holder.NodePortIn(false))
	}
	if newcomer.NodePortIn(false) != 0 || newcomer.NodePortIn(true) != 30080 {
		t.Errorf("the newcomer's NodePort: IPv4 %d, IPv6 %d; want 0 and 30080",
			newcomer.NodePortIn(false), newcomer.NodePortIn(true))
	}
	sourcetest.CheckUniqueKeys(t, "per-family NodePort", st)
}

// TestContestedClusterIPSurvivesRestart: two Services on one cluster IP,
// the second arriving while the first holds it (as state files allow).
// The Service keeping it is the one a Builder given both at once picks,
// as a restarted proxy and render are: the older, a Service without a
// creation time (hand-written) counting as the newest, then by name.
func TestContestedClusterIPSurvivesRestart(t *testing.T) {
	tests := []struct {
		name            string
		first, second   int // creation times; <0: none
		wantFirstKeeps  bool
		firstN, secondN string
	}{
		{"an older Service arrives: it takes the address", 2, 1, false, "zz", "aa"},
		{"a newer Service arrives: the holder keeps it", 1, 2, true, "zz", "aa"},
		{"one without creation time arrives: the holder keeps it", 2, -1, true, "zz", "aa"},
		{"the holder has no creation time: an API-made one takes it", -1, 2, false, "aa", "zz"},
		{"neither has a creation time: the first by name", -1, -1, false, "zz", "aa"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := csvc(tt.firstN, tt.first, "10.96.0.50")
			second := csvc(tt.secondN, tt.second, "10.96.0.50")
			running := NewBuilder("node-1")
			if err := running.UpsertService(first); err != nil {
				t.Fatal(err)
			}
			running.State()
			if err := running.UpsertService(second); err != nil {
				t.Fatal(err)
			}
			restarted := NewBuilder("node-1")
			for _, s := range []*corev1.Service{second, first} {
				if err := restarted.UpsertService(s); err != nil {
					t.Fatal(err)
				}
			}
			holder := tt.secondN
			if tt.wantFirstKeeps {
				holder = tt.firstN
			}
			for what, b := range map[string]*Builder{"running": running, "restarted": restarted} {
				claims := stateClaims(b.State())
				if got := claims[claim{addr: netip.MustParseAddr("10.96.0.50"), proto: model.TCP, port: 80}]; got != holder {
					t.Errorf("%s: 10.96.0.50:80 held by %q, want %q", what, got, holder)
				}
			}
		})
	}
}

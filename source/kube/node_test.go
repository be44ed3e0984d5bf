package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/internal/sourcetest"
)

func TestNodeInfo(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		want     model.Node
		wantErrs []string
	}{{
		name: "dual-stack node",
		yaml: `
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {topology.kubernetes.io/zone: zone-a}
spec:
  podCIDR: 10.244.0.0/24
  podCIDRs: [10.244.0.0/24, "fd00:10:244::/64"]
status:
  addresses:
  - {type: Hostname, address: node-1}
  - {type: ExternalIP, address: 192.0.2.1}
  - {type: InternalIP, address: 10.99.0.1}
  - {type: InternalIP, address: "fd00:99::1"}
  - {type: InternalDNS, address: node-1.cluster.local}
  - {type: InternalIP, address: 10.99.0.1}`,
		want: model.Node{
			Name: "node-1", Zone: "zone-a",
			PodCIDRs: sourcetest.Prefixes("10.244.0.0/24", "fd00:10:244::/64"),
			// InternalIPs first, as kube-proxy's GetNodeHostIPs: the
			// first of a family is the primary one.
			IPs: sourcetest.Addrs("10.99.0.1", "fd00:99::1", "192.0.2.1"),
		},
	}, {
		name: "single podCIDR, no zone",
		yaml: `
apiVersion: v1
kind: Node
metadata: {name: node-2}
spec: {podCIDR: 10.244.1.0/24}`,
		want: model.Node{Name: "node-2", PodCIDRs: sourcetest.Prefixes("10.244.1.0/24")},
	}, {
		name: "bad values are dropped",
		yaml: `
apiVersion: v1
kind: Node
metadata: {name: node-3}
spec: {podCIDRs: [10.244.2.0/24, 10.244.2.0/99]}
status:
  addresses:
  - {type: InternalIP, address: 10.99.0.999}
  - {type: InternalIP, address: 10.99.0.3}`,
		want: model.Node{Name: "node-3", PodCIDRs: sourcetest.Prefixes("10.244.2.0/24"), IPs: sourcetest.Addrs("10.99.0.3")},
		wantErrs: []string{
			`node node-3: spec.podCIDRs[1]: invalid CIDR "10.244.2.0/99", dropped`,
			`node node-3: status.addresses[0] (InternalIP): invalid IP address "10.99.0.999", dropped`,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NodeInfo(sourcetest.Decode(t, tt.yaml)[0].(*corev1.Node))
			sourcetest.MustEqual(t, "node", got, tt.want)
			sourcetest.CheckErrors(t, SplitErrors(err), tt.wantErrs...)
		})
	}
}

func TestParsePrefix(t *testing.T) {
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"10.1.2.3", "10.1.2.3/32"},
		{"2001:db8::1", "2001:db8::1/128"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"::/0", "::/0"},
		{"010.001.0.0/16", "10.1.0.0/16"},
		{"10.0.0.0/", ""},
		{"10.0.0.0/+8", ""},
		{"10.0.0.0/33", ""},
		{"fe80::1%eth0/64", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, err := parsePrefix(tt.in)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("parsePrefix(%q) = %v, want an error", tt.in, got)
		case tt.want != "" && (err != nil || got.String() != tt.want):
			t.Errorf("parsePrefix(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestParseIP(t *testing.T) {
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"10.0.0.1", "10.0.0.1"},
		{"010.000.000.001", "10.0.0.1"},
		{"::ffff:10.0.0.1", "10.0.0.1"},
		{"fd00::1", "fd00::1"},
		{"256.0.0.1", ""},
		{"0.0.0.0", ""},
		{"::", ""},
		{"fe80::1%eth0", ""},
		{"10.0.0", ""},
		{"1.2.3.0004", ""},
	}
	for _, tt := range tests {
		got, err := parseIP(tt.in)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("parseIP(%q) = %v, want an error", tt.in, got)
		case tt.want != "" && (err != nil || got.String() != tt.want):
			t.Errorf("parseIP(%q) = %v, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}

func TestNodeLeaving(t *testing.T) {
	now := metav1.Now()
	tests := []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"ordinary", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, false},
		{"being deleted", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", DeletionTimestamp: &now}}, true},
		{"tainted by the cluster autoscaler", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule}}}}, true},
		{"another taint", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}, false},
	}
	for _, tt := range tests {
		got, err := NodeInfo(tt.node)
		if err != nil || got.Leaving != tt.want {
			t.Errorf("%s: Leaving = %v (err %v), want %v", tt.name, got.Leaving, err, tt.want)
		}
	}
}

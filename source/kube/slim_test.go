package kube_test

import (
	"fmt"
	"os"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kube-nftproxy/kube-nftproxy/model"
	"github.com/kube-nftproxy/kube-nftproxy/source/kube"
	"github.com/kube-nftproxy/kube-nftproxy/source/manifest"
)

// richObjects has every field the Builder reads, and some it does not.
const richObjects = `
apiVersion: v1
kind: Service
metadata:
  name: lb
  namespace: shop
  creationTimestamp: "2025-01-02T03:04:05Z"
  labels: {app: shop}
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: "192.0.2.0/24, 198.51.100.0/24"
    kubectl.kubernetes.io/last-applied-configuration: '{"big":"json"}'
  managedFields:
  - manager: kubectl
    operation: Update
    apiVersion: v1
    fieldsType: FieldsV1
    fieldsV1: {"f:spec": {"f:type": {}}}
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: owner, uid: "1234"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.1.1
  clusterIPs: [10.96.1.1]
  externalIPs: [203.0.113.7]
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 31000
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  trafficDistribution: PreferClose
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, targetPort: 53, nodePort: 30053}
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.9}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-abcde
  namespace: shop
  labels: {kubernetes.io/service-name: lb, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: "2099-01-02T03:04:05Z"
    other: x
  managedFields:
  - manager: kube-controller-manager
    operation: Update
    apiVersion: discovery.k8s.io/v1
    fieldsType: FieldsV1
    fieldsV1: {"f:endpoints": {}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 53, protocol: UDP}
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true, serving: true, terminating: false}
  nodeName: node-1
  zone: zone-a
  hints: {forZones: [{name: zone-a}], forNodes: [{name: node-1}]}
  targetRef: {kind: Pod, namespace: shop, name: web-1, uid: "5678"}
  hostname: web-1
- addresses: [10.244.2.5]
  conditions: {ready: false, serving: true, terminating: true}
  nodeName: node-2
  zone: zone-b
- addresses: [10.244.3.5, 10.244.3.6]
- addresses: [not-an-ip]
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {topology.kubernetes.io/zone: zone-a}
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]
status:
  addresses: [{type: InternalIP, address: 192.168.1.10}]
  images: [{names: [registry.example/app:1], sizeBytes: 100}]
`

// The Builder sees the same through the informers' transform as without
// it: same state, errors, change counts and trigger times.
func TestSlimKeepsWhatTheBuilderReads(t *testing.T) {
	dec, err := manifest.NewDecoder()
	if err != nil {
		t.Fatal(err)
	}
	var objs []manifest.Object
	for _, f := range []string{"../filesource/testdata/kubectl-get.yaml", "../../examples/demo/services.yaml",
		"../../examples/demo/endpointslices.yaml", "../../examples/demo/node.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := dec.Decode(data, f)
		objs = append(objs, o...)
	}
	o, errs := dec.Decode([]byte(richObjects), "rich")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	objs = append(objs, o...)

	feed := func(b *kube.Builder, transform func(any) (any, error)) {
		for _, o := range objs {
			obj, err := transform(o.Obj)
			if err != nil {
				t.Fatal(err)
			}
			switch v := obj.(type) {
			case *corev1.Service:
				_ = b.UpsertService(v)
			case *discoveryv1.EndpointSlice:
				_ = b.UpsertEndpointSlice(v)
			case *corev1.Node:
				_ = b.UpsertNode(v)
			}
		}
	}
	for _, node := range []string{"node-1", "kind-worker", "demo-node"} {
		raw, slimmed := kube.NewBuilder(node), kube.NewBuilder(node)
		feed(raw, func(o any) (any, error) { return o, nil })
		// Twice: client-go asks for an idempotent transform.
		slim := kube.NewSlimmer().Slim
		feed(slimmed, func(o any) (any, error) {
			o, err := slim(o)
			if err != nil {
				return nil, err
			}
			return slim(o)
		})
		if raw.ChangeCounts() != slimmed.ChangeCounts() {
			t.Errorf("node %s: change counts differ: %+v, %+v", node, raw.ChangeCounts(), slimmed.ChangeCounts())
		}
		a, ta := raw.StateWithTriggers()
		b, tb := slimmed.StateWithTriggers()
		if len(ta) == 0 || !reflect.DeepEqual(ta, tb) {
			t.Errorf("node %s: trigger times %v with the transform, %v without", node, tb, ta)
		}
		a.Changes, b.Changes = model.StateChanges{}, model.StateChanges{} // lineages differ by design
		if !reflect.DeepEqual(a, b) {
			t.Errorf("node %s: state differs with the transform:\n%+v\n%+v", node, a, b)
		}
		if x, y := fmt.Sprint(raw.Errors()), fmt.Sprint(slimmed.Errors()); x != y {
			t.Errorf("node %s: errors differ with the transform:\n%s\n%s", node, x, y)
		}
	}
	slim := kube.NewSlimmer().Slim
	names := map[string]*string{}
	for _, o := range objs {
		s, _ := slim(o.Obj)
		switch v := s.(type) {
		case *corev1.Service:
			if v.ManagedFields != nil || v.OwnerReferences != nil || len(v.Annotations) > 1 {
				t.Errorf("%s: slimmed Service keeps %+v", o.Source, v.ObjectMeta)
			}
		case *discoveryv1.EndpointSlice:
			for _, e := range v.Endpoints {
				if e.TargetRef != nil || e.Hostname != nil {
					t.Errorf("%s: slimmed endpoint keeps %+v", o.Source, e)
				}
				if e.NodeName == nil {
					continue
				}
				if p, ok := names[*e.NodeName]; ok && p != e.NodeName {
					t.Errorf("%s: node name %s not shared", o.Source, *e.NodeName)
				}
				names[*e.NodeName] = e.NodeName
			}
		case *corev1.Node:
			if v.Status.Images != nil {
				t.Errorf("%s: slimmed Node keeps its images", o.Source)
			}
		}
	}
}

package kube

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Slim returns a fresh object holding only what the Builder reads of obj:
// the API source's informers' transform (their caches keep the result) and
// what the file source keeps of each object it read. The rest (managedFields,
// last-applied annotations, owner references, endpoints' targetRefs, a
// Node's images and conditions) was most of what they held at scale, and
// copying, rather than trimming in place, also frees the list response
// the objects were decoded into, which otherwise lives as long as any of
// its items. Tombstones (cache.DeletedFinalStateUnknown) hold objects
// already slimmed and are never passed here. Applying it twice gives the
// same object, as client-go asks; objects of other types come back as they
// are.
//
// Endpoints also share their node names and conditions: decoded, each
// endpoint has its own copies, a few dozen bytes per endpoint.
func (s *Slimmer) Slim(obj any) (any, error) {
	if o, ok := obj.(runtime.Object); ok {
		return s.SlimObject(o), nil
	}
	return obj, nil
}

// SlimObject is Slim for a decoded object (the file source's).
func (s *Slimmer) SlimObject(obj runtime.Object) runtime.Object {
	switch o := obj.(type) {
	case *corev1.Service:
		return slimService(o)
	case *discoveryv1.EndpointSlice:
		return s.slimSlice(o)
	case *corev1.Node:
		return slimNode(o)
	case *networkingv1.ServiceCIDR:
		return &networkingv1.ServiceCIDR{ObjectMeta: slimMeta(&o.ObjectMeta), Spec: o.Spec}
	}
	return obj
}

// Slimmer holds what slimmed endpoints share; it is safe for concurrent
// use (each informer calls its transform from a goroutine of its own).
type Slimmer struct {
	mu    sync.Mutex
	nodes map[string]*string
}

// maxNodeNames bounds the node names kept for sharing: nodes come and go
// over a cluster's life, and the table starts over when it is full.
const maxNodeNames = 1 << 14

// NewSlimmer returns a Slimmer sharing nothing yet.
func NewSlimmer() *Slimmer { return &Slimmer{nodes: map[string]*string{}} }

// nodeName returns a shared pointer to the same name.
func (s *Slimmer) nodeName(n *string) *string {
	if n == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.nodes[*n]; ok {
		return p
	}
	if len(s.nodes) >= maxNodeNames {
		clear(s.nodes)
	}
	s.nodes[*n] = n
	return n
}

// Shared condition values; nothing writes through them (client-go's
// caches are read-only).
var (
	condTrue, condFalse = true, false
)

func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &condTrue
	}
	return &condFalse
}

// slimMeta keeps the identity, the labels (the ignore rules and a slice's
// Service are labels) and the named annotations.
func slimMeta(m *metav1.ObjectMeta, annotations ...string) metav1.ObjectMeta {
	out := metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels,
	}
	for _, k := range annotations {
		if v, ok := m.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string, len(annotations))
			}
			out.Annotations[k] = v
		}
	}
	return out
}

func slimService(svc *corev1.Service) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: slimMeta(&svc.ObjectMeta, corev1.AnnotationLoadBalancerSourceRangesKey),
		Spec:       svc.Spec,
		Status:     corev1.ServiceStatus{LoadBalancer: svc.Status.LoadBalancer},
	}
}

func (s *Slimmer) slimSlice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{
		ObjectMeta:  slimMeta(&es.ObjectMeta, corev1.EndpointsLastChangeTriggerTime),
		AddressType: es.AddressType,
		Ports:       es.Ports,
		Endpoints:   make([]discoveryv1.Endpoint, len(es.Endpoints)),
	}
	for i, e := range es.Endpoints {
		out.Endpoints[i] = discoveryv1.Endpoint{
			Addresses: e.Addresses,
			Conditions: discoveryv1.EndpointConditions{
				Ready: sharedBool(e.Conditions.Ready), Serving: sharedBool(e.Conditions.Serving),
				Terminating: sharedBool(e.Conditions.Terminating),
			},
			NodeName: s.nodeName(e.NodeName), Zone: e.Zone, Hints: e.Hints,
		}
	}
	return out
}

func slimNode(n *corev1.Node) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: slimMeta(&n.ObjectMeta),
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs, Taints: n.Spec.Taints},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}
}

package informers

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// slim is the informers' transform: the caches keep of each object only
// what the Builder reads, in a fresh object. The rest (managedFields,
// last-applied annotations, owner references, endpoints' targetRefs, a
// Node's images and conditions) was most of what they held at scale, and
// copying, rather than trimming in place, also frees the list response
// the objects were decoded into, which otherwise lives as long as any of
// its items. Tombstones (cache.DeletedFinalStateUnknown) hold objects
// already slimmed and are never passed here. Applying it twice gives the
// same object, as client-go asks.
func slim(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return slimService(o), nil
	case *discoveryv1.EndpointSlice:
		return slimSlice(o), nil
	case *corev1.Node:
		return slimNode(o), nil
	}
	return obj, nil
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

func slimSlice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{
		ObjectMeta:  slimMeta(&es.ObjectMeta, corev1.EndpointsLastChangeTriggerTime),
		AddressType: es.AddressType,
		Ports:       es.Ports,
		Endpoints:   make([]discoveryv1.Endpoint, len(es.Endpoints)),
	}
	for i, e := range es.Endpoints {
		out.Endpoints[i] = discoveryv1.Endpoint{
			Addresses: e.Addresses, Conditions: e.Conditions,
			NodeName: e.NodeName, Zone: e.Zone, Hints: e.Hints,
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

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The cluster's optional load balancer, by KNP_CLUSTER_LB: LBNone (the
// default) leaves type=LoadBalancer Services without an address, as a
// cluster without a cloud provider does; LBMetalLB runs MetalLB in L2
// mode, the load balancer bare-metal clusters run.
const (
	LBNone    = ""
	LBMetalLB = "metallb"
)

// MetalLB's pieces: its namespace, version (hack/cluster/build.sh builds
// it), and the address pool it hands out, inside the node network so that
// the node network's namespace (where e2e.test runs) reaches the addresses
// on br0, the speaker of one node answering ARP (IPv4) or NDP (IPv6).
const (
	MetalLBNamespace = "metallb-system"
	MetalLBVersion   = "v0.16.1"
	LBPool4          = "10.200.0.200-10.200.0.239"
	LBPool6          = "fd00:200::200-fd00:200::239"
	// The node network reaches the pools from its own address outside the
	// nodes' subnets (an external client, as a load balancer's clients
	// are): e2e.test's "Source IP is preserved" check fails a client
	// inside the nodes' /16 (/64), whatever the proxy does. LBRoute4 and
	// LBRoute6 cover the pools (and nothing else in use).
	LBClient4 = "10.210.0.1"
	LBClient6 = "fd00:210::1"
	LBRoute4  = "10.200.0.192/26"
	LBRoute6  = "fd00:200::200/120"
	// metallbProbePort is the health port of both components (MetalLB's
	// default): the controller serves it on every address, the speaker
	// on 127.0.0.1 of its node.
	metallbProbePort = 17472
)

// checkLB refuses an unknown KNP_CLUSTER_LB before anything starts.
func (l Layout) checkLB() error {
	switch l.LB {
	case LBNone, LBMetalLB:
		return nil
	}
	return fmt.Errorf("KNP_CLUSTER_LB=%q: want %q or unset", l.LB, LBMetalLB)
}

// LBPools are the load balancer's address ranges, one per family of the
// cluster, the primary first.
func (l Layout) LBPools() []string { return l.byFamily(LBPool4, LBPool6) }

// MetalLBCRDs is the file of MetalLB's CustomResourceDefinitions that
// hack/cluster/build.sh copies out of the module it builds from.
func (l Layout) MetalLBCRDs() string {
	return filepath.Join(l.Cache, "cluster", "metallb", "crds.yaml")
}

// metallbRefs are the controller's and the speaker's image references
// (hack/cluster/images.sh), when the cluster has the load balancer.
type metallbRefs struct{ controller, speaker string }

// loadBalancerImages finds MetalLB's images and CRDs before anything
// starts (nothing when KNP_CLUSTER_LB is unset).
func (l Layout) loadBalancerImages(imgs []Image) (metallbRefs, error) {
	if l.LB != LBMetalLB {
		return metallbRefs{}, nil
	}
	r := metallbRefs{controller: FindImage(imgs, "controller"), speaker: FindImage(imgs, "speaker")}
	if r.controller == "" || r.speaker == "" {
		return r, fmt.Errorf("KNP_CLUSTER_LB=metallb: images.txt lacks MetalLB's controller or speaker (KNP_CLUSTER_LB=metallb make cluster-build cluster-images)")
	}
	if _, err := os.Stat(l.MetalLBCRDs()); err != nil {
		return r, fmt.Errorf("KNP_CLUSTER_LB=metallb: %w (hack/cluster/build.sh metallb)", err)
	}
	return r, nil
}

// nodeImages are the images the nodes import: all of images.txt, less
// MetalLB's when the cluster runs without it (images.sh builds them
// whenever their binaries exist), so the default cluster stays as it was.
func (l Layout) nodeImages(imgs []Image) []Image {
	if l.LB == LBMetalLB {
		return imgs
	}
	var out []Image
	for _, im := range imgs {
		if !strings.Contains(im.Ref, "/metallb/") {
			out = append(out, im)
		}
	}
	return out
}

// deployLoadBalancer applies MetalLB's CRDs, waits until the API server
// serves them, applies its workloads and address pool, and waits for the
// controller and a speaker on every node.
func (l Layout) deployLoadBalancer(ctx context.Context, refs metallbRefs, logf func(string, ...any)) error {
	if l.LB != LBMetalLB {
		return nil
	}
	if _, err := l.kubectl(ctx, "apply", "--server-side", "-f", l.MetalLBCRDs()); err != nil {
		return fmt.Errorf("MetalLB CRDs: %w", err)
	}
	if _, err := l.kubectl(ctx, "wait", "--for=condition=Established", "--timeout=2m",
		"crd/ipaddresspools.metallb.io", "crd/l2advertisements.metallb.io"); err != nil {
		return fmt.Errorf("MetalLB CRDs: %w", err)
	}
	if err := l.apply(ctx, "metallb", l.MetalLBManifests(refs.controller, refs.speaker)); err != nil {
		return err
	}
	for _, what := range []string{"deployment/controller", "daemonset/speaker"} {
		if err := l.waitRollout(ctx, MetalLBNamespace, what); err != nil {
			return fmt.Errorf("MetalLB %s: %w", what, err)
		}
	}
	if err := l.routeLBClient(ctx); err != nil {
		return err
	}
	logf("MetalLB %s (L2) ready, pool %s, reached from %s", MetalLBVersion,
		strings.Join(l.LBPools(), ", "), strings.Join(l.byFamily(LBClient4, LBClient6), ", "))
	return nil
}

// routeLBClient gives the node network its client address of each family
// and routes the pools on br0 from it. The nodes answer it through their
// default route (via br0's address). The namespace goes at cluster-down,
// and with it both.
func (l Layout) routeLBClient(ctx context.Context) error {
	for _, step := range l.lbClientSteps() {
		if err := run(ctx, append([]string{"ip", "-n", l.NodeNet}, step...)...); err != nil {
			return fmt.Errorf("load balancer client route: %w", err)
		}
	}
	return nil
}

// lbClientSteps are routeLBClient's ip(8) commands, per family.
func (l Layout) lbClientSteps() [][]string {
	var steps [][]string
	if l.HasIPv4() {
		steps = append(steps, []string{"addr", "add", LBClient4 + "/32", "dev", BridgeName},
			[]string{"route", "add", LBRoute4, "dev", BridgeName, "src", LBClient4})
	}
	if l.HasIPv6() {
		steps = append(steps, []string{"addr", "add", LBClient6 + "/128", "dev", BridgeName, "nodad"},
			[]string{"-6", "route", "add", LBRoute6, "dev", BridgeName, "src", LBClient6})
	}
	return steps
}

// MetalLBManifests are MetalLB's namespace, RBAC, controller Deployment,
// speaker DaemonSet, address pool and L2 advertisement: our own minimal
// objects (MetalLB's CRDs come from its module). The controller runs
// without its admission webhook (nothing here writes invalid
// configurations, and a webhook would need certificates), the speakers
// without memberlist (no --ml-bindaddr: a node's speaker counts as gone
// when its node is not Ready); both serve their metrics on a port the
// kernel picks (--port=0: v0.16.1 cannot turn them off), so the speakers
// on the nodes' network hold no fixed port.
func (l Layout) MetalLBManifests(controllerImage, speakerImage string) string {
	return metallbRBAC + fmt.Sprintf(metallbWorkloads, controllerImage, speakerImage, metallbProbePort) +
		l.metallbPool()
}

// metallbPool is the address pool of the cluster's families and its L2
// advertisement, answered on the nodes' eth0 alone (not on the pod network's
// bridges and tunnels).
func (l Layout) metallbPool() string {
	var addrs strings.Builder
	for _, p := range l.LBPools() {
		fmt.Fprintf(&addrs, "  - %s\n", p)
	}
	return fmt.Sprintf(`---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: nodenet
  namespace: metallb-system
spec:
  addresses:
%s---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata:
  name: nodenet
  namespace: metallb-system
spec:
  ipAddressPools: [nodenet]
  interfaces: [eth0]
`, addrs.String())
}

// metallbRBAC: one ServiceAccount per component, both bound to the same
// two roles (a test cluster: one set of rules is easier to read than two
// nearly equal ones). Cluster-wide they read Services, their endpoints,
// nodes, namespaces and MetalLB's objects (the status objects are watched
// across namespaces: without it their caches never sync and no Service
// gets an address), write Services' status (the controller's ingress
// addresses) and events; in their namespace they read Secrets, ConfigMaps,
// their own pod, and write the status objects each component keeps there.
const metallbRBAC = `apiVersion: v1
kind: Namespace
metadata:
  name: metallb-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: controller
  namespace: metallb-system
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: speaker
  namespace: metallb-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: knp:metallb
rules:
- apiGroups: [""]
  resources: ["services", "endpoints", "nodes", "namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services/status"]
  verbs: ["update"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["metallb.io"]
  resources: ["*"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: knp:metallb
  namespace: metallb-system
rules:
- apiGroups: [""]
  resources: ["secrets", "configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get"]
- apiGroups: ["metallb.io"]
  resources: ["configurationstates", "configurationstates/status", "servicel2statuses",
    "servicel2statuses/status", "servicebgpstatuses", "servicebgpstatuses/status"]
  verbs: ["create", "update", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: knp:metallb
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: knp:metallb
subjects:
- {kind: ServiceAccount, name: controller, namespace: metallb-system}
- {kind: ServiceAccount, name: speaker, namespace: metallb-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: knp:metallb
  namespace: metallb-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: knp:metallb
subjects:
- {kind: ServiceAccount, name: controller, namespace: metallb-system}
- {kind: ServiceAccount, name: speaker, namespace: metallb-system}
`

// metallbWorkloads: the controller (allocates addresses from the pool and
// writes them into Services' status) and the speaker on every node's
// network (answers ARP/NDP for the addresses its node announces: it needs
// raw sockets, NET_RAW). Arguments: the two images and the health port.
const metallbWorkloads = `---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: controller
  namespace: metallb-system
  labels: {app: metallb, component: controller}
spec:
  replicas: 1
  selector:
    matchLabels: {app: metallb, component: controller}
  template:
    metadata:
      labels: {app: metallb, component: controller}
    spec:
      serviceAccountName: controller
      terminationGracePeriodSeconds: 1
      securityContext: {runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534}
      containers:
      - name: controller
        image: %[1]s
        imagePullPolicy: IfNotPresent
        args: ["--port=0", "--webhook-mode=disabled", "--log-level=info"]
        env:
        - {name: METALLB_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: METALLB_POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {drop: ["ALL"]}
        readinessProbe:
          httpGet: {path: /readyz, port: %[3]d}
          periodSeconds: 2
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: speaker
  namespace: metallb-system
  labels: {app: metallb, component: speaker}
spec:
  selector:
    matchLabels: {app: metallb, component: speaker}
  template:
    metadata:
      labels: {app: metallb, component: speaker}
    spec:
      serviceAccountName: speaker
      hostNetwork: true
      terminationGracePeriodSeconds: 2
      containers:
      - name: speaker
        image: %[2]s
        imagePullPolicy: IfNotPresent
        args: ["--port=0", "--log-level=info"]
        env:
        - {name: METALLB_NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: METALLB_POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: METALLB_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {drop: ["ALL"], add: ["NET_RAW"]}
        readinessProbe:
          httpGet: {host: 127.0.0.1, path: /readyz, port: %[3]d}
          periodSeconds: 2
`

// LBSmokeResult is the load balancer check of one ingress address of
// Service knp-smoke/web-lb: the backends that answered requests from the
// node network, and the client addresses they saw.
type LBSmokeResult struct {
	Addr              string
	Backends, Sources []string
}

// SmokeLoadBalancer (with MetalLB only) gives the smoke check's web pods a
// type=LoadBalancer Service with externalTrafficPolicy Local, of every
// family of the cluster, and checks that each ingress address comes from
// the pool and, called from the node network, is answered by one node's
// own backend that sees the caller's address: MetalLB attracts the traffic
// to a node with an endpoint, the proxy delivers it there unmasqueraded.
func (l Layout) SmokeLoadBalancer(ctx context.Context) ([]LBSmokeResult, error) {
	if l.LB != LBMetalLB {
		return nil, nil
	}
	spec := "  type: LoadBalancer\n  externalTrafficPolicy: Local\n"
	if l.Family == FamilyDual {
		spec += "  ipFamilyPolicy: RequireDualStack\n"
	}
	if err := l.apply(ctx, "smoke-lb", smokeService("web-lb", spec)); err != nil {
		return nil, err
	}
	var addrs []string
	err := poll(ctx, time.Minute, func() (bool, error) {
		out, _ := l.kubectl(ctx, "-n", "knp-smoke", "get", "service", "web-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}")
		addrs = strings.Fields(out)
		return len(addrs) == len(l.LBPools()), nil
	})
	if err != nil {
		return nil, fmt.Errorf("knp-smoke/web-lb got ingress addresses %v, want one per family: %w", addrs, err)
	}
	var res []LBSmokeResult
	for _, addr := range addrs {
		r, err := l.smokeLBAddr(ctx, addr)
		res = append(res, r)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// smokeLBAddr checks one ingress address (see SmokeLoadBalancer).
func (l Layout) smokeLBAddr(ctx context.Context, addr string) (LBSmokeResult, error) {
	r := LBSmokeResult{Addr: addr}
	if !inPools(addr, l.LBPools()) {
		return r, fmt.Errorf("knp-smoke/web-lb: ingress %s is outside the pools %v", addr, l.LBPools())
	}
	client, _ := sameFamily(addr, []string{LBClient4, LBClient6})
	var err error
	err = poll(ctx, time.Minute, func() (bool, error) {
		r.Backends, r.Sources, err = l.requestsFromNodeNet(ctx, net.JoinHostPort(addr, "80"))
		return err == nil && len(r.Backends) == 1 && slices.Equal(r.Sources, []string{client}), nil
	})
	if err != nil {
		return r, fmt.Errorf("load balancer %s from the node network: backends %v saw sources %v, want one node's backend seeing %s: %w",
			addr, r.Backends, r.Sources, client, err)
	}
	return r, nil
}

// inPools says whether addr lies in one of the ranges "first-last" (of
// either family).
func inPools(addr string, pools []string) bool {
	return slices.ContainsFunc(pools, func(pool string) bool { return inRange(addr, pool) })
}

// inRange says whether addr lies in the range "first-last".
func inRange(addr, firstLast string) bool {
	a, b, _ := strings.Cut(firstLast, "-")
	ip, err0 := netip.ParseAddr(addr)
	first, err1 := netip.ParseAddr(a)
	last, err2 := netip.ParseAddr(b)
	if err0 != nil || err1 != nil || err2 != nil {
		return false
	}
	return first.Compare(ip) <= 0 && ip.Compare(last) <= 0
}

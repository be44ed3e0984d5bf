package cluster

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// faultsManifests are the backends (two netexec pods on the second node),
// Service echo (NodePort: TCP 80 and UDP 81), Service echo-local (the same
// backends through an external IP with externalTrafficPolicy: Local), the
// idle client pod on the first node, and Service other with two idle pods
// of its own on the first node (the unrelated endpoint a fault removes).
func (l Layout) faultsManifests(agnhost string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", faultsNS)
	pod := func(name, node, role string, args string, probe bool) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels:
    role: %s
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: agnhost
    image: %s
    imagePullPolicy: IfNotPresent
    args: %s
`, name, faultsNS, role, node, agnhost, args)
		if probe {
			b.WriteString("    readinessProbe:\n      httpGet:\n        path: /healthz\n        port: 8080\n      periodSeconds: 1\n")
		}
	}
	backends := `["netexec", "--http-port=8080", "--udp-port=8081"]`
	pod("echo-1", l.Nodes[1].Name, "echo", backends, true)
	pod("echo-2", l.Nodes[1].Name, "echo", backends, true)
	pod("client", l.Nodes[0].Name, "client", `["pause"]`, false)
	pod("other-1", l.Nodes[0].Name, "other", `["pause"]`, false)
	pod("other-2", l.Nodes[0].Name, "other", `["pause"]`, false)
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: %[1]s
spec:
  type: NodePort
  selector:
    role: echo
  ports:
  - name: tcp
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: %[2]d
  - name: udp
    protocol: UDP
    port: 81
    targetPort: 8081
    nodePort: %[3]d
---
apiVersion: v1
kind: Service
metadata:
  name: echo-local
  namespace: %[1]s
spec:
  type: NodePort
  externalTrafficPolicy: Local
  externalIPs: [%[4]s]
  selector:
    role: echo
  ports:
  - name: tcp
    protocol: TCP
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: other
  namespace: %[1]s
spec:
  selector:
    role: other
  ports:
  - port: 80
`, faultsNS, faultsTCPPort, faultsUDPPort, faultsExternalIP)
	return b.String()
}

// faultRun is one cluster's fault run: the new-connection streams the
// client pod sends, and the long-lived flows held open across every fault.
type faultRun struct {
	l         Layout
	clusterIP string // Service echo's
	streams   []target
	flows     *flows
}

// faultsWorkloads deploys the workloads, waits until every target answers
// from the client pod, routes the external IP to the second node from the
// node network (outside the cluster), and opens the long-lived flows.
func (l Layout) faultsWorkloads(ctx context.Context, t *testing.T) *faultRun {
	t.Helper()
	imgs, err := ReadImages(l.ImagesDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.apply(ctx, "faults-namespace", fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", faultsNS)); err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, time.Minute, func() (bool, error) {
		_, err := l.kubectl(ctx, "-n", faultsNS, "get", "serviceaccount", "default")
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("ServiceAccount %s/default: %v", faultsNS, err)
	}
	if err := l.apply(ctx, "faults", l.faultsManifests(FindImage(imgs, "agnhost"))); err != nil {
		t.Fatal(err)
	}
	if _, err := l.kubectl(ctx, "-n", faultsNS, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m"); err != nil {
		t.Fatalf("faults pods: %v", err)
	}
	clusterIP, err := l.kubectl(ctx, "-n", faultsNS, "get", "svc", "echo", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	var tg []target
	add := func(name, ip string, tcp, udp int) {
		tg = append(tg, target{name, "tcp", fmt.Sprintf("%s:%d", ip, tcp)}, target{name, "udp", fmt.Sprintf("%s:%d", ip, udp)})
	}
	add("ClusterIP", clusterIP, 80, 81)
	add("NodePort "+l.Nodes[0].Name, l.Nodes[0].IP, faultsTCPPort, faultsUDPPort)
	add("NodePort "+l.Nodes[1].Name, l.Nodes[1].IP, faultsTCPPort, faultsUDPPort)
	ns := l.clientNetNS(ctx, t)
	if err := l.waitAnswered(ctx, ns, tg); err != nil {
		t.Fatalf("targets %v never all answered from the client pod: %v", tg, err)
	}
	if err := run(ctx, nsenter(l.NodeNet, "ip", "route", "replace", faultsExternalIP+"/32", "via", l.Nodes[1].IP)...); err != nil {
		t.Fatal(err)
	}
	fl := l.flowTargets(ns, clusterIP)
	fs, err := openFlows(ctx, fl)
	if err != nil {
		t.Fatalf("long-lived flows: %v", err)
	}
	t.Cleanup(fs.close)
	return &faultRun{l: l, clusterIP: clusterIP, streams: tg, flows: fs}
}

// flowTargets are the long-lived flows: from the client pod on the first
// node to the ClusterIP (TCP and UDP) and to the first node's NodePort;
// from the node network, outside the cluster, to the first node's NodePort
// (TCP and UDP, masqueraded to the second node's endpoints) and to the
// external IP with externalTrafficPolicy: Local (routed to the second node).
func (l Layout) flowTargets(podNS, clusterIP string) []flowTarget {
	outside := NetNSPath(l.NodeNet)
	nodePort := func(port int) string { return fmt.Sprintf("%s:%d", l.Nodes[0].IP, port) }
	return []flowTarget{
		{"pod → ClusterIP", "tcp", clusterIP + ":80", podNS},
		{"pod → ClusterIP", "udp", clusterIP + ":81", podNS},
		{"pod → NodePort " + l.Nodes[0].Name, "tcp", nodePort(faultsTCPPort), podNS},
		{"outside → NodePort " + l.Nodes[0].Name, "tcp", nodePort(faultsTCPPort), outside},
		{"outside → NodePort " + l.Nodes[0].Name, "udp", nodePort(faultsUDPPort), outside},
		{"outside → external IP, Local", "tcp", faultsExternalIP + ":80", outside},
	}
}

// waitAnswered polls until every target answers a request from netns.
func (l Layout) waitAnswered(ctx context.Context, netns string, tg []target) error {
	return poll(ctx, time.Minute, func() (bool, error) {
		tr, err := startTraffic(ctx, netns, tg)
		if err != nil {
			return false, err
		}
		for _, s := range tr.stopAfterOneEach() {
			if s.requests == 0 || s.failed > 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// stopAfterOneEach waits until every stream has made a request, then stops.
func (tr *traffic) stopAfterOneEach() []streamStats {
	_ = poll(context.Background(), 5*time.Second, func() (bool, error) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, s := range tr.streams {
			if s.requests == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	return tr.stop()
}

// clientNetNS is the client pod's network namespace, by its container's pid.
func (l Layout) clientNetNS(ctx context.Context, t *testing.T) string {
	t.Helper()
	id, err := l.kubectl(ctx, "-n", faultsNS, "get", "pod", "client", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimPrefix(strings.TrimSpace(id), "containerd://")
	out, err := output(ctx, l.ctrBin(), "--address", l.ContainerdSocket(l.Nodes[0]), "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			if _, err := strconv.Atoi(f[1]); err == nil {
				return "/proc/" + f[1] + "/ns/net"
			}
		}
	}
	t.Fatalf("client container %q not in the tasks of %s:\n%s", id, l.Nodes[0].Name, out)
	return ""
}

// measure runs fault with the streams flowing, then a few more seconds,
// prints the FAULT line of the streams and the FLOWS line of the
// long-lived flows, and fails the test on any failed request or exchange.
func (r *faultRun) measure(ctx context.Context, t *testing.T, name string, fault func() error) []streamStats {
	t.Helper()
	r.flows.look() // the window starts now
	tr, err := startTraffic(ctx, r.l.clientNetNS(ctx, t), r.streams)
	if err != nil {
		t.Fatal(err)
	}
	faultErr := fault()
	_ = wait(ctx, faultsSettling)
	stats := tr.stop()
	flows := r.flows.look()
	for _, line := range []string{summary(name, stats), flowSummary(name, flows)} {
		t.Log(line)
		fmt.Println(line)
	}
	for _, d := range failureDetails(stats) {
		t.Log(d)
	}
	if faultErr != nil {
		t.Fatalf("%s: %v", name, faultErr)
	}
	for _, s := range stats {
		if s.failed > 0 {
			t.Errorf("%s: %s %s: %d of %d requests failed", name, s.name, s.proto, s.failed, s.requests)
		}
	}
	for _, f := range flows {
		if f.failed > 0 {
			t.Errorf("%s: long-lived %s %s: %d of %d exchanges failed, %d broken; first: %s",
				name, f.name, f.proto, f.failed, f.exchanges, f.broken, f.firstErr)
		}
	}
	return stats
}

// finish logs the long-lived flows' counts over the whole run.
func (r *faultRun) finish(t *testing.T) {
	line := flowSummary("whole-run", r.flows.totals())
	t.Log(line)
	fmt.Println(line)
}

// proxyPod is one of the proxy DaemonSet's pods.
type proxyPod struct {
	node, name, image string
	ready, deleting   bool
}

// proxyPods are the pods of kube-system DaemonSet ds, by owner: a label
// would not tell them apart (our pods may carry kube-proxy's k8s-app label).
func (l Layout) proxyPods(ctx context.Context, ds string) ([]proxyPod, error) {
	out, err := l.kubectl(ctx, "-n", "kube-system", "get", "pods", "-o",
		`jsonpath={range .items[*]}{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}|{.spec.nodeName}|{.metadata.name}|{.spec.containers[0].image}|{.status.conditions[?(@.type=="Ready")].status}|{.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	var pods []proxyPod
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 6 || f[0] != "DaemonSet/"+ds {
			continue
		}
		pods = append(pods, proxyPod{node: f[1], name: f[2], image: f[3], ready: f[4] == "True", deleting: f[5] != ""})
	}
	return pods, nil
}

// waitProxyPods waits until every node has exactly one ready, not
// terminating pod of DaemonSet ds whose name is not in gone and whose image
// is image (when set).
func (l Layout) waitProxyPods(ctx context.Context, ds string, gone map[string]bool, image string) ([]proxyPod, error) {
	var pods []proxyPod
	err := poll(ctx, 3*time.Minute, func() (bool, error) {
		var err error
		if pods, err = l.proxyPods(ctx, ds); err != nil {
			return false, nil
		}
		if len(pods) != len(l.Nodes) {
			return false, nil
		}
		for _, p := range pods {
			if gone[p.name] || !p.ready || p.deleting || (image != "" && p.image != image) {
				return false, nil
			}
		}
		return true, nil
	})
	return pods, err
}

// deleteProxyPods deletes our pods on both nodes at once, faultsDeletes
// times, each time waiting until both replacements are Ready.
func (l Layout) deleteProxyPods(ctx context.Context, t *testing.T) error {
	for i := 1; i <= faultsDeletes; i++ {
		pods, err := l.waitProxyPods(ctx, "kube-nftproxy", nil, "")
		if err != nil {
			return fmt.Errorf("before delete %d: %w", i, err)
		}
		gone := map[string]bool{}
		args := []string{"-n", "kube-system", "delete", "pod", "--wait=false"}
		for _, p := range pods {
			gone[p.name] = true
			args = append(args, p.name)
		}
		start := time.Now()
		t.Logf("%s delete %d: %v", start.Format("15:04:05.000"), i, args[5:])
		if _, err := l.kubectl(ctx, args...); err != nil {
			return err
		}
		if _, err := l.waitProxyPods(ctx, "kube-nftproxy", gone, ""); err != nil {
			return fmt.Errorf("replacements of delete %d: %w", i, err)
		}
		t.Logf("delete %d: both replacements Ready after %v", i, time.Since(start).Round(100*time.Millisecond))
	}
	return nil
}

// rollProxy imports image b into both nodes' containerd and rolls our
// DaemonSet to it.
func (l Layout) rollProxy(ctx context.Context, t *testing.T, b Image) error {
	for _, n := range l.Nodes {
		if _, err := l.importImages(ctx, n, []Image{b}); err != nil {
			return err
		}
	}
	start := time.Now()
	if _, err := l.kubectl(ctx, "-n", "kube-system", "set", "image", "daemonset/kube-nftproxy", "kube-nftproxy="+b.Ref); err != nil {
		return err
	}
	if err := l.waitRollout(ctx, "kube-system", "daemonset/kube-nftproxy"); err != nil {
		return err
	}
	if _, err := l.waitProxyPods(ctx, "kube-nftproxy", nil, b.Ref); err != nil {
		return err
	}
	t.Logf("rolled to %s in %v", b.Ref, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// removeUnrelatedEndpoint deletes pod other-2 and waits until Service
// other's EndpointSlices name other-1 alone.
func (l Layout) removeUnrelatedEndpoint(ctx context.Context) error {
	if _, err := l.kubectl(ctx, "-n", faultsNS, "delete", "pod", "other-2", "--wait=false"); err != nil {
		return err
	}
	return poll(ctx, time.Minute, func() (bool, error) {
		out, err := l.kubectl(ctx, "-n", faultsNS, "get", "endpointslices", "-l", "kubernetes.io/service-name=other",
			"-o", `jsonpath={range .items[*].endpoints[*]}{.targetRef.name}{"\n"}{end}`)
		return err == nil && strings.TrimSpace(out) == "other-1", nil
	})
}

// addPort adds a third port (TCP 82) to Service echo and waits until it
// answers from the client pod.
func (r *faultRun) addPort(ctx context.Context, t *testing.T) error {
	patch := `[{"op":"add","path":"/spec/ports/-","value":{"name":"tcp-added","protocol":"TCP","port":82,"targetPort":8080}}]`
	if _, err := r.l.kubectl(ctx, "-n", faultsNS, "patch", "service", "echo", "--type=json", "-p", patch); err != nil {
		return err
	}
	start := time.Now()
	added := []target{{"ClusterIP added port", "tcp", r.clusterIP + ":82"}}
	if err := r.l.waitAnswered(ctx, r.l.clientNetNS(ctx, t), added); err != nil {
		return fmt.Errorf("the added port never answered: %w", err)
	}
	t.Logf("the added port answered after %v", time.Since(start).Round(10*time.Millisecond))
	return nil
}

// restartDaemon stops one of the cluster's daemons (SIGTERM), starts it
// again with argv in namespace ns, and polls ready until it says so.
func (l Layout) restartDaemon(ctx context.Context, t *testing.T, name, ns string, argv []string, ready func() bool) error {
	start := time.Now()
	if err := l.stopDaemon(name, 20*time.Second); err != nil {
		return err
	}
	d, err := l.startDaemon(name, ns, argv)
	if err != nil {
		return err
	}
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		if d.exited() {
			return false, fmt.Errorf("%s exited: see %s", name, l.logFile(name))
		}
		return ready(), nil
	})
	if err != nil {
		return fmt.Errorf("%s after its restart: %w", name, err)
	}
	t.Logf("%s restarted and ready in %v", name, time.Since(start).Round(10*time.Millisecond))
	return nil
}

// restartAPIServer restarts kube-apiserver and waits for its /readyz.
func (l Layout) restartAPIServer(ctx context.Context, t *testing.T) error {
	return l.restartDaemon(ctx, t, "kube-apiserver", l.NodeNet, l.controlPlaneArgs(l.etcdBin())["kube-apiserver"], l.apiReady(ctx))
}

// restartEtcd restarts etcd and waits until the API server is ready again.
func (l Layout) restartEtcd(ctx context.Context, t *testing.T) error {
	return l.restartDaemon(ctx, t, "etcd", l.NodeNet, l.controlPlaneArgs(l.etcdBin())["etcd"], l.apiReady(ctx))
}

func (l Layout) apiReady(ctx context.Context) func() bool {
	return func() bool {
		out, _ := l.kubectl(ctx, "get", "--raw", "/readyz")
		return strings.TrimSpace(out) == "ok"
	}
}

// restartKubelets restarts each node's kubelet in turn, waiting until it
// has renewed its node lease after the restart and its Node is Ready.
func (l Layout) restartKubelets(ctx context.Context, t *testing.T) error {
	for _, n := range l.Nodes {
		since := time.Now()
		ready := func() bool {
			renewed, err := l.kubectl(ctx, "-n", "kube-node-lease", "get", "lease", n.Name, "-o", "jsonpath={.spec.renewTime}")
			if err != nil {
				return false
			}
			at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(renewed))
			if err != nil || !at.After(since) {
				return false
			}
			status, err := l.kubectl(ctx, "get", "node", n.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			return err == nil && strings.TrimSpace(status) == "True"
		}
		argv := append([]string{l.K8sBin("kubelet")}, l.KubeletArgs(n)...)
		if err := l.restartDaemon(ctx, t, "kubelet-"+n.Name, n.Name, argv, ready); err != nil {
			return err
		}
	}
	return nil
}

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
// Service echo (NodePort: TCP 80 and UDP 81) and the idle client pod on the
// first node.
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
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: %s
spec:
  type: NodePort
  selector:
    role: echo
  ports:
  - name: tcp
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: %d
  - name: udp
    protocol: UDP
    port: 81
    targetPort: 8081
    nodePort: %d
`, faultsNS, faultsTCPPort, faultsUDPPort)
	return b.String()
}

// faultsWorkloads deploys the workloads, waits until every target answers
// from the client pod, and returns the targets.
func (l Layout) faultsWorkloads(ctx context.Context, t *testing.T) []target {
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
	err = poll(ctx, time.Minute, func() (bool, error) {
		tr, err := startTraffic(ctx, ns, tg)
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
	if err != nil {
		t.Fatalf("targets %v never all answered from the client pod: %v", tg, err)
	}
	return tg
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

// measureFault runs fault with traffic flowing, then a few more seconds,
// prints the FAULT line and fails the test on any failed request.
func (l Layout) measureFault(ctx context.Context, t *testing.T, name string, tg []target, fault func() error) []streamStats {
	t.Helper()
	tr, err := startTraffic(ctx, l.clientNetNS(ctx, t), tg)
	if err != nil {
		t.Fatal(err)
	}
	faultErr := fault()
	_ = wait(ctx, faultsSettling)
	stats := tr.stop()
	line := summary(name, stats)
	t.Log(line)
	fmt.Println(line)
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
	return stats
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

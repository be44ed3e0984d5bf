package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
	"github.com/kube-nftproxy/kube-nftproxy/e2e/sandbox"
)

const (
	kubeadmManifest = "../../deploy/kubeadm/kube-proxy.yaml"
	// Where kubeadm's DaemonSet mounts the ConfigMap and where the
	// kubelet mounts the service account; the test's directories stand
	// for them.
	kubeadmConfigDir   = "/var/lib/kube-proxy/"
	serviceAccountDir  = "/var/run/secrets/kubernetes.io/serviceaccount/"
	kubeadmImageBinary = "/usr/local/bin/kube-proxy"
	kubeadmWebName     = "kubeadm-web"
	kubeadmWebIP       = "10.96.21.1"
)

// TestKubeadmDaemonSet runs the proxy exactly as kubeadm 1.37's DaemonSet
// (deploy/kubeadm/kube-proxy.yaml, read at test time) runs kube-proxy:
// its container command (`--config=/var/lib/kube-proxy/config.conf
// --hostname-override=$(NODE_NAME)`) and its ConfigMap's config.conf and
// kubeconfig.conf, against a real API server. Only the paths are moved to
// the test's directories and the kubeconfig's server is the test's. The
// proxy takes kube-proxy's defaults for what config.conf leaves zero,
// reaches its first sync from the API server, warns of no flag, and a
// Service created then answers on its ClusterIP.
func TestKubeadmDaemonSet(t *testing.T) {
	t.Parallel()
	needRoot(t)
	cm, ds := readKubeadmManifest(t)
	if err := apiserver.Available(); err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skipf("skipping API server test: %v", err)
	}
	e := &env{sb: newSandbox(t, []sandbox.Pod{podA, podB, podC})}
	e.startServer(t, podA)
	e.startServer(t, podB)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	srv, err := apiserver.StartWithOptions(ctx, t, apiserver.Options{NetNS: e.sb.NS(sandbox.Node)})
	if err != nil {
		t.Fatal(err)
	}
	a := &apiEnv{env: e, srv: srv}

	argv := kubeadmCommand(t, ds, writeKubeadmFiles(t, cm, srv))
	t.Logf("running %s", strings.Join(argv, " "))
	checkKubeadmDefaults(t, argv)
	e.proxy = launchProxy(t, e.sb, 5*time.Second, argv...)
	e.proxy.waitLog(t, 60*time.Second, "the proxy's first sync from the API server", func(lines []string) bool {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "API server caches filled") })
		return i >= 0 && countSyncs(lines[i:]) > 0
	})
	if slices.ContainsFunc(e.proxy.log.lines(), func(l string) bool { return strings.Contains(l, "flag ignored") }) {
		t.Errorf("the DaemonSet's flags are all honoured by kube-proxy, yet one was warned of as ignored")
	}

	a.do(t, "POST", servicesPath, apiService(kubeadmWebName, kubeadmWebIP, nil), nil)
	a.do(t, "POST", slicesPath, apiSlice(kubeadmWebName, nil, podA, podB), nil)
	first, all := e.waitTraffic(t, time.Now(), 30*time.Second, hostPort(kubeadmWebIP, "80"), podA.Name, podB.Name)
	t.Logf("ClusterIP answered after %v (both endpoints after %v)", first, all)
	a.nodePortCycles(t, kubeadmNodePortCycles)
}

// kubeadmNodePortCycles is how often TestKubeadmDaemonSet creates and
// deletes a NodePort Service.
const kubeadmNodePortCycles = 8

// nodePortCycles does what upstream's "should update nodePort: http" spec
// does, cycles times: a NodePort Service and its slice are created, the
// node dials its own address on the NodePort until both endpoints have
// answered, then both are deleted (in either order, as the EndpointSlice
// controller may lag the Service or not) and the node dials until the
// port is refused. A change the proxy missed would be repaired only by
// the periodic sync (kubeadm's syncPeriod, 30 s), so the port answering
// for 10 s after its deletion fails the test.
func (a *apiEnv) nodePortCycles(t *testing.T, cycles int) {
	t.Helper()
	node := sandbox.NodeIPv4.Addr().String()
	var created, deleted []time.Duration
	for i := range cycles {
		name, port := fmt.Sprintf("kubeadm-np-%d", i), int32(30400+i)
		svc := apiService(name, fmt.Sprintf("10.96.21.%d", 10+i), nil)
		svc.Spec.Type = corev1.ServiceTypeNodePort
		svc.Spec.Ports[0].NodePort = port
		addr := hostPort(node, fmt.Sprint(port))
		start := time.Now()
		a.do(t, "POST", servicesPath, svc, nil)
		a.do(t, "POST", slicesPath, apiSlice(name, nil, podA, podB), nil)
		a.proxy.poll(t, 30*time.Second, addr+" answered by both endpoints from the node", func(ctx context.Context) error {
			return a.probeFrom(ctx, sandbox.Node, addr, 16, podA.Name, podB.Name)
		})
		created = append(created, time.Since(start))
		paths := []string{servicesPath + "/" + name, slicesPath + "/" + name + "-ipv4"}
		if i%2 == 1 {
			slices.Reverse(paths)
		}
		start = time.Now()
		for _, p := range paths {
			a.do(t, "DELETE", p, nil, nil)
		}
		a.proxy.poll(t, 10*time.Second, addr+" refused after its Service was deleted", func(ctx context.Context) error {
			sum, _ := a.client(ctx, sandbox.Node, "tcp", addr, 1, "--timeout", "200ms")
			if sum == nil || sum.OK > 0 {
				return fmt.Errorf("%s still answers", addr)
			}
			return nil
		})
		deleted = append(deleted, time.Since(start))
	}
	t.Logf("NodePort answering from the node after creation: %v; refused after deletion: %v", created, deleted)
}

// readKubeadmManifest reads the kube-proxy ConfigMap and DaemonSet of
// deploy/kubeadm/kube-proxy.yaml.
func readKubeadmManifest(t *testing.T) (*corev1.ConfigMap, *appsv1.DaemonSet) {
	t.Helper()
	data, err := os.ReadFile(kubeadmManifest)
	if err != nil {
		t.Fatal(err)
	}
	var cm *corev1.ConfigMap
	var ds *appsv1.DaemonSet
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			err = yaml.UnmarshalStrict(doc, cm)
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			err = yaml.UnmarshalStrict(doc, ds)
		}
		if err != nil {
			t.Fatalf("%s: %v", kind.Kind, err)
		}
	}
	if cm == nil || ds == nil || cm.Data["config.conf"] == "" || cm.Data["kubeconfig.conf"] == "" {
		t.Fatalf("%s: want a ConfigMap with config.conf and kubeconfig.conf, and a DaemonSet", kubeadmManifest)
	}
	return cm, ds
}

// writeKubeadmFiles writes the ConfigMap's files to a directory standing
// for /var/lib/kube-proxy, and the service account's ca.crt and token
// (the API server's CA and kube-proxy's token) to one standing for its
// mount; the files' paths to them and the kubeconfig's server are
// rewritten, nothing else. It returns the first directory.
func writeKubeadmFiles(t *testing.T, cm *corev1.ConfigMap, srv *apiserver.Server) string {
	t.Helper()
	dir, sa := t.TempDir(), t.TempDir()
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(sa, "ca.crt"), srv.CAPEM)
	write(filepath.Join(sa, "token"), []byte(srv.ProxyToken))
	kubeconfig := strings.ReplaceAll(cm.Data["kubeconfig.conf"], serviceAccountDir, sa+"/")
	server := regexp.MustCompile(`(?m)^(\s*server:\s*)\S+$`)
	if !server.MatchString(kubeconfig) {
		t.Fatalf("kubeconfig.conf has no server:\n%s", kubeconfig)
	}
	kubeconfig = server.ReplaceAllString(kubeconfig, "${1}"+srv.URL)
	write(filepath.Join(dir, "kubeconfig.conf"), []byte(kubeconfig))
	config := cm.Data["config.conf"]
	if !strings.Contains(config, kubeadmConfigDir+"kubeconfig.conf") {
		t.Fatalf("config.conf does not name %skubeconfig.conf:\n%s", kubeadmConfigDir, config)
	}
	write(filepath.Join(dir, "config.conf"), []byte(strings.ReplaceAll(config, kubeadmConfigDir+"kubeconfig.conf", filepath.Join(dir, "kubeconfig.conf"))))
	return dir
}

// kubeadmCommand is the DaemonSet container's command as the kubelet runs
// it on node-1: $(NODE_NAME) expanded from its fieldRef, our binary for
// the image's /usr/local/bin/kube-proxy, dir for /var/lib/kube-proxy.
func kubeadmCommand(t *testing.T, ds *appsv1.DaemonSet, dir string) []string {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, v := range c.Env {
		if v.ValueFrom != nil && v.ValueFrom.FieldRef != nil && v.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			env[v.Name] = nodeName
		}
	}
	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) == 0 || argv[0] != kubeadmImageBinary {
		t.Fatalf("the DaemonSet runs %v, not %s", argv, kubeadmImageBinary)
	}
	argv[0] = proxyBin
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for i, a := range argv[1:] {
		a = ref.ReplaceAllStringFunc(a, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			t.Fatalf("%s: no such variable in the DaemonSet", m)
			return m
		})
		argv[i+1] = strings.ReplaceAll(a, kubeadmConfigDir, dir+"/")
	}
	return argv
}

// checkKubeadmDefaults runs the command with --write-config-to and checks
// that what kubeadm's config.conf may leave zero has kube-proxy's default.
func checkKubeadmDefaults(t *testing.T, argv []string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "effective.yaml")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := append(slices.Clone(argv), "--write-config-to", out)
	// In a network namespace of its own, though it touches nothing.
	if b, err := exec.CommandContext(ctx, "unshare", append([]string{"--net"}, cmd...)...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"configSyncPeriod: 15m0s", "oomScoreAdj: -999", "  burst: 10", "  qps: 5", "  contentType: application/vnd.kubernetes.protobuf",
		"metricsBindAddress: 127.0.0.1:10249", "healthzBindAddress: 0.0.0.0:10256", "  maxPerCore: 32768", "  min: 131072",
		"  tcpEstablishedTimeout: 24h0m0s", "  tcpCloseWaitTimeout: 1h0m0s", "  flushFrequency: 5s", "mode: iptables",
		"detectLocalMode: ClusterCIDR", "  masqueradeBit: 14", "  syncPeriod: 30s", "  localhostNodePorts: true",
		"hostnameOverride: " + nodeName,
	} {
		if !strings.Contains(string(data), want+"\n") {
			t.Errorf("effective configuration lacks %q:\n%s", want, data)
		}
	}
}

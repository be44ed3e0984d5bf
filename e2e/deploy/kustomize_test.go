package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/apiserver"
)

// overlay is a kustomization in deploy/ and what it must render.
type overlay struct {
	dir     string // under the repository's root
	objects string // kind/name of each object, in kubectl kustomize's order
	mode    string // --proxy-mode of both containers; kubeadm: config.conf's mode
	// privileged: the proxy container privileged, with no capability list
	// and no allowPrivilegeEscalation (base/: NET_ADMIN alone).
	privileged bool
}

// baseObjects are deploy/base's objects.
const baseObjects = "ServiceAccount/kube-nftproxy ClusterRole/kube-nftproxy ClusterRoleBinding/kube-nftproxy ConfigMap/kube-nftproxy DaemonSet/kube-nftproxy"

// overlays are deploy/ (the default install) and every overlay beside it.
var overlays = []overlay{
	{dir: "deploy", objects: baseObjects, mode: "nftables"},
	{dir: "deploy/base", objects: baseObjects, mode: "nftables"},
	{dir: "deploy/iptables", objects: baseObjects, mode: "iptables"},
	{dir: "deploy/ipvs", objects: baseObjects, mode: "ipvs"},
	{dir: "deploy/privileged", objects: baseObjects, mode: "nftables", privileged: true},
	{dir: "deploy/kubeadm", mode: "iptables", privileged: true,
		objects: "ServiceAccount/kube-proxy Role/kube-proxy RoleBinding/kube-proxy ClusterRoleBinding/kubeadm:node-proxier ConfigMap/kube-proxy DaemonSet/kube-proxy"},
}

// findKubectl is the cached kubectl (hack/cluster/build.sh kubectl), or
// why there is none.
func findKubectl() (string, error) {
	p := apiserver.KubectlPath()
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no kubectl at %s (hack/cluster/build.sh kubectl builds it, or set KNP_KUBECTL)", p)
	}
	return p, nil
}

// needKubectl skips the test without kubectl, or fails it with
// KNP_REQUIRE_APISERVER=1 (CI builds kubectl with the cluster's binaries).
func needKubectl(t *testing.T) string {
	t.Helper()
	p, err := findKubectl()
	if err != nil {
		if os.Getenv("KNP_REQUIRE_APISERVER") == "1" {
			t.Fatalf("KNP_REQUIRE_APISERVER=1 but %v", err)
		}
		t.Skip(err.Error())
	}
	return p
}

// kustomize is `kubectl kustomize dir` (dir under the repository's root).
func kustomize(t *testing.T, kubectl, dir string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", dir))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", dir, err, stderr.Bytes())
	}
	return out
}

// theDaemonSet is the one DaemonSet among ms.
func theDaemonSet(t *testing.T, ms []manifest) appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	for _, m := range ms {
		if m.kind != "DaemonSet" {
			continue
		}
		js, err := yaml.Marshal(m.body)
		if err == nil {
			err = yaml.UnmarshalStrict(js, &ds)
		}
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	t.Fatal("no DaemonSet")
	return ds
}

// checkMode: both containers' --proxy-mode, or, for kubeadm's DaemonSet,
// which passes --config, its ConfigMap's config.conf mode.
func checkMode(ms []manifest, ds appsv1.DaemonSet, want string) error {
	pod := ds.Spec.Template.Spec
	if ds.Name == "kube-proxy" {
		for _, m := range ms {
			data, _ := m.body.(map[string]any)["data"].(map[string]any)
			if conf, ok := data["config.conf"].(string); ok && strings.Contains(conf, "\nmode: "+want+"\n") {
				return nil
			}
		}
		return fmt.Errorf("no config.conf with mode: %s", want)
	}
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		return fmt.Errorf("%d init containers and %d containers, want 1 and 1", len(pod.InitContainers), len(pod.Containers))
	}
	for _, c := range []corev1.Container{pod.InitContainers[0], pod.Containers[0]} {
		var modes []string
		for _, a := range c.Command {
			if m, ok := strings.CutPrefix(a, "--proxy-mode="); ok {
				modes = append(modes, m)
			}
		}
		if fmt.Sprint(modes) != "["+want+"]" {
			return fmt.Errorf("container %s: --proxy-mode %v, want [%s]", c.Name, modes, want)
		}
	}
	return nil
}

// checkPrivileged: the proxy container privileged as kube-proxy's, with
// nothing the API server refuses beside it; or least privilege, NET_ADMIN
// alone, as base/ has it.
func checkPrivileged(ds appsv1.DaemonSet, want bool) error {
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil {
		return errors.New("the proxy container has no securityContext")
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	switch {
	case privileged != want:
		return fmt.Errorf("the proxy container privileged: %v, want %v", privileged, want)
	case want && (sc.Capabilities != nil || sc.AllowPrivilegeEscalation != nil):
		return fmt.Errorf("privileged, yet capabilities %v and allowPrivilegeEscalation %v are kept", sc.Capabilities, sc.AllowPrivilegeEscalation)
	case !want && (sc.Capabilities == nil || fmt.Sprint(sc.Capabilities.Add) != "[NET_ADMIN]"):
		return fmt.Errorf("capabilities %v, want NET_ADMIN alone", sc.Capabilities)
	}
	return nil
}

// kubectl kustomize renders deploy/ and every overlay (what `kubectl
// apply -k` applies): the objects and their kinds, the mode each sets, the
// proxy's privileges.
func TestKustomizeOverlays(t *testing.T) {
	kubectl := needKubectl(t)
	for _, o := range overlays {
		t.Run(o.dir, func(t *testing.T) {
			ms := parseManifests(t, o.dir, kustomize(t, kubectl, o.dir))
			var objects []string
			for _, m := range ms {
				objects = append(objects, m.kind+"/"+m.name)
			}
			if got := strings.Join(objects, " "); got != o.objects {
				t.Errorf("objects\n%s\nwant\n%s", got, o.objects)
			}
			ds := theDaemonSet(t, ms)
			if err := checkMode(ms, ds, o.mode); err != nil {
				t.Error(err)
			}
			if err := checkPrivileged(ds, o.privileged); err != nil {
				t.Error(err)
			}
		})
	}
}

// An overlay changes what it says and nothing else: each rendered
// overlay, with that change undone, is deploy/ as rendered.
func TestKustomizeOverlaysChangeOnlyTheirPart(t *testing.T) {
	kubectl := needKubectl(t)
	base := string(kustomize(t, kubectl, "deploy"))
	for _, tc := range []struct{ dir, undo string }{
		{"deploy/iptables", "--proxy-mode=iptables"},
		{"deploy/ipvs", "--proxy-mode=ipvs"},
	} {
		got := strings.ReplaceAll(string(kustomize(t, kubectl, tc.dir)), tc.undo, "--proxy-mode=nftables")
		if got != base {
			t.Errorf("%s differs from deploy/ in more than %s", tc.dir, tc.undo)
		}
	}
	// privileged/: its patch, as `kubectl patch --patch-file` applies it,
	// gives the same DaemonSet.
	patched, err := exec.Command(kubectl, "patch", "--local", "--kubeconfig=/dev/null", "-o", "yaml",
		"-f", "../../deploy/base/daemonset.yaml", "--patch-file", "../../deploy/privileged/patch.yaml").Output()
	if err != nil {
		t.Fatalf("kubectl patch --local: %v", err)
	}
	want := theDaemonSet(t, parseManifests(t, "kubectl patch", patched))
	got := theDaemonSet(t, parseManifests(t, "deploy/privileged", kustomize(t, kubectl, "deploy/privileged")))
	if !reflect.DeepEqual(got.Spec, want.Spec) {
		t.Errorf("deploy/privileged's DaemonSet is not base/'s patched by kubectl patch --patch-file:\n%+v\nwant\n%+v", got.Spec, want.Spec)
	}
}

// deploy/ rendered by kustomize holds exactly the objects of the plain
// files in base/, and deploy/kubeadm those of kube-proxy.yaml, so the two
// cannot drift (a file left out of a kustomization fails here too).
func TestKustomizeIsTheFiles(t *testing.T) {
	kubectl := needKubectl(t)
	for _, tc := range []struct{ dir, files string }{
		{"deploy", "../../deploy/base/*.yaml"},
		{"deploy/kubeadm", "../../deploy/kubeadm/*.yaml"},
	} {
		files := map[string]any{}
		for _, m := range readManifests(t, manifestFiles(t, tc.files)...) {
			files[m.kind+"/"+m.name] = m.body
		}
		rendered := parseManifests(t, tc.dir, kustomize(t, kubectl, tc.dir))
		for _, m := range rendered {
			if !reflect.DeepEqual(m.body, files[m.kind+"/"+m.name]) {
				t.Errorf("%s: %s/%s differs from the file's", tc.dir, m.kind, m.name)
			}
		}
		if len(rendered) != len(files) {
			t.Errorf("%s renders %d objects, its files hold %d", tc.dir, len(rendered), len(files))
		}
	}
}

// A user's own overlay sets the image with kustomize's images:, as the
// docs say: every container of deploy/ and of each overlay, init
// containers included, then runs it.
func TestKustomizeImage(t *testing.T) {
	kubectl := needKubectl(t)
	const image = "example.org/kube-nftproxy:v1"
	for _, o := range overlays {
		t.Run(o.dir, func(t *testing.T) {
			mine := t.TempDir()
			abs, err := filepath.Abs(filepath.Join("..", "..", o.dir))
			if err != nil {
				t.Fatal(err)
			}
			rel, err := filepath.Rel(mine, abs) // kustomize takes no absolute base
			if err != nil {
				t.Fatal(err)
			}
			k := fmt.Sprintf("resources:\n- %s\nimages:\n- name: kube-nftproxy\n  newName: example.org/kube-nftproxy\n  newTag: v1\n", rel)
			if err := os.WriteFile(filepath.Join(mine, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(kubectl, "kustomize", mine).CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl kustomize: %v: %s", err, out)
			}
			pod := theDaemonSet(t, parseManifests(t, o.dir, out)).Spec.Template.Spec
			for _, c := range append(pod.InitContainers, pod.Containers...) {
				if c.Image != image {
					t.Errorf("container %s runs %s, want %s", c.Name, c.Image, image)
				}
			}
		})
	}
}

// Both ways the docs give work against a real kube-apiserver: each
// overlay applies (server-side dry run); `kubectl apply -k deploy/` then
// `kubectl patch --patch-file deploy/privileged/patch.yaml` leaves the
// proxy privileged. Applying deploy/ again over the patch is refused
// (privileged beside allowPrivilegeEscalation: false), which is why the docs
// say to move to deploy/privileged, whose apply over it is taken.
func TestKubectlApplyKustomize(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver (skipped with -short)")
	}
	kubectl := needKubectl(t)
	srv, err := apiserver.Start(t.Context(), t)
	if err != nil {
		t.Fatal(err)
	}
	kubectlRun := func(args ...string) (string, error) {
		out, err := exec.Command(kubectl, append([]string{"--kubeconfig=" + srv.Kubeconfig}, args...)...).CombinedOutput()
		return string(out), err
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := kubectlRun(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	for _, o := range overlays {
		run("apply", "--dry-run=server", "-k", filepath.Join("..", "..", o.dir))
	}
	run("apply", "-k", "../../deploy")
	run("-n", "kube-system", "patch", "daemonset", "kube-nftproxy", "--patch-file", "../../deploy/privileged/patch.yaml")
	get := func() appsv1.DaemonSet {
		return theDaemonSet(t, parseManifests(t, "kubectl get", []byte(run("-n", "kube-system", "get", "daemonset", "kube-nftproxy", "-o", "yaml"))))
	}
	if err := checkPrivileged(get(), true); err != nil {
		t.Errorf("after kubectl patch: %v", err)
	}
	if out, err := kubectlRun("apply", "--dry-run=server", "-k", "../../deploy"); err == nil {
		t.Errorf("deploy/ applied over the privileged patch was taken:\n%s", out)
	}
	run("apply", "-k", "../../deploy/privileged")
	if err := checkPrivileged(get(), true); err != nil {
		t.Errorf("after kubectl apply -k deploy/privileged: %v", err)
	}
}

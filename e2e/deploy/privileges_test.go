package deploy

import (
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The DaemonSets whose privileges are checked: the proxy's and the one
// that removes its rules.
const (
	proxyDaemonSet   = "../../deploy/base/daemonset.yaml"
	cleanupDaemonSet = "../../deploy/cleanup/daemonset.yaml"
)

// daemonSetPod reads a DaemonSet file's pod spec and its raw lines.
func daemonSetPod(t *testing.T, file string) (corev1.PodSpec, []string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec corev1.PodSpec `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &ds); err != nil {
		t.Fatal(err)
	}
	return ds.Spec.Template.Spec, strings.Split(string(data), "\n")
}

// privileges lists what a pod is granted beyond an unprivileged
// container, each as the YAML line that grants it.
func privileges(pod corev1.PodSpec) []string {
	var out []string
	if pod.HostNetwork {
		out = append(out, "hostNetwork: true")
	}
	if pod.HostPID {
		out = append(out, "hostPID: true")
	}
	if pod.HostIPC {
		out = append(out, "hostIPC: true")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			out = append(out, "path: "+v.HostPath.Path)
		}
	}
	for _, c := range append(append([]corev1.Container(nil), pod.InitContainers...), pod.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			out = append(out, "privileged: true")
		}
		if sc.Capabilities != nil {
			for _, c := range sc.Capabilities.Add {
				out = append(out, "- "+string(c))
			}
		}
	}
	return out
}

// reasonAbove says whether the comment block right above the line that
// grants privilege holds a "why:".
func reasonAbove(lines []string, grant string) error {
	for i, l := range lines {
		if strings.TrimSpace(l) != grant {
			continue
		}
		for j := i - 1; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "#"); j-- {
			if strings.Contains(lines[j], "# why:") {
				return nil
			}
		}
		return fmt.Errorf("%q (line %d) has no \"# why:\" comment above it", grant, i+1)
	}
	return fmt.Errorf("%q not found as a line of its own", grant)
}

// Every privilege deploy/'s DaemonSets ask for (a capability, privileged,
// a host path, the host's network, PID or IPC namespace) carries its
// reason: adding one without a "# why:" comment fails here.
func TestEveryPrivilegeHasAReason(t *testing.T) {
	for _, file := range []string{proxyDaemonSet, cleanupDaemonSet} {
		pod, lines := daemonSetPod(t, file)
		grants := privileges(pod)
		if len(grants) < 2 {
			t.Errorf("%s: privileges %v: the host network and NET_ADMIN at least", file, grants)
		}
		for _, g := range grants {
			if err := reasonAbove(lines, g); err != nil {
				t.Errorf("%s: %v", file, err)
			}
		}
	}
	if err := reasonAbove([]string{"        privileged: true"}, "privileged: true"); err == nil {
		t.Error("a grant with no comment above was taken")
	}
}

// The proxy itself runs with the least that passes everything: NET_ADMIN
// alone, every other capability dropped, no privilege escalation, a
// read-only root, the runtime's default seccomp profile, no host path;
// root's work (the sysctls) is the init container's --init-only.
func TestProxyContainerLeastPrivilege(t *testing.T) {
	pod, _ := daemonSetPod(t, proxyDaemonSet)
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 1 {
		t.Fatalf("want one init container and one container, have %d and %d", len(pod.InitContainers), len(pod.Containers))
	}
	if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil ||
		pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the pod's seccompProfile is not RuntimeDefault")
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("volume %s mounts the host's %s", v.Name, v.HostPath.Path)
		}
	}
	sc := pod.Containers[0].SecurityContext
	switch {
	case sc == nil || sc.Capabilities == nil:
		t.Fatal("the proxy container has no capabilities section")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("the proxy container is privileged")
	case fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" || fmt.Sprint(sc.Capabilities.Add) != "[NET_ADMIN]":
		t.Errorf("capabilities drop %v add %v, want drop [ALL] add [NET_ADMIN]", sc.Capabilities.Drop, sc.Capabilities.Add)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the proxy's root file system is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("the proxy may escalate privileges")
	}
	if cmd := strings.Join(pod.InitContainers[0].Command, " "); !strings.Contains(cmd, "--init-only") {
		t.Errorf("the init container runs %q, not --init-only", cmd)
	}
}

// The cleanup DaemonSet runs our image's --cleanup, and nothing else, in
// its one init container, privileged to put sysctls back as the proxy's
// init container is to set them; its main container, which only keeps the
// pod, has no privilege at all; no host path, PID or IPC.
func TestCleanupDaemonSetRunsCleanupOnly(t *testing.T) {
	proxy, _ := daemonSetPod(t, proxyDaemonSet)
	pod, _ := daemonSetPod(t, cleanupDaemonSet)
	if len(pod.InitContainers) != 1 || len(pod.Containers) != 1 {
		t.Fatalf("want one cleanup container and one container, have %d and %d", len(pod.InitContainers), len(pod.Containers))
	}
	cleanup, keep := pod.InitContainers[0], pod.Containers[0]
	if got := strings.Join(append(cleanup.Command, cleanup.Args...), " "); got != "/kube-nftproxy --cleanup" {
		t.Errorf("the cleanup container runs %q, want /kube-nftproxy --cleanup", got)
	}
	if cleanup.Image != proxy.Containers[0].Image {
		t.Errorf("the cleanup container's image is %q, the proxy's %q", cleanup.Image, proxy.Containers[0].Image)
	}
	if want := []string{"hostNetwork: true", "privileged: true"}; fmt.Sprint(privileges(pod)) != fmt.Sprint(want) {
		t.Errorf("privileges %v, want %v", privileges(pod), want)
	}
	if sc := cleanup.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the cleanup container has a writable root")
	}
	sc := keep.SecurityContext
	switch {
	case sc == nil || sc.Capabilities == nil || fmt.Sprint(sc.Capabilities.Drop) != "[ALL]":
		t.Error("the keep container does not drop every capability")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("the keep container may escalate privileges")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the keep container has a writable root")
	}
	if !strings.Contains(keep.Image, "/pause:") || len(keep.Command)+len(keep.Args) != 0 {
		t.Errorf("the keep container is %s %v %v, want the pause image as it is", keep.Image, keep.Command, keep.Args)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the cleanup pod mounts a service account token it never uses")
	}
}

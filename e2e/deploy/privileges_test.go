package deploy

import (
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// daemonSetPod reads deploy/daemonset.yaml's pod spec and its raw lines.
func daemonSetPod(t *testing.T) (corev1.PodSpec, []string) {
	t.Helper()
	data, err := os.ReadFile("../../deploy/daemonset.yaml")
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

// privileges lists what deploy/'s pod is granted beyond an unprivileged
// container, each as the YAML line that grants it.
func privileges(pod corev1.PodSpec) []string {
	var out []string
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

// Every privilege deploy/'s DaemonSet asks for (a capability, privileged,
// a host path, the host's PID or IPC namespace) carries its reason: adding
// one without a "# why:" comment fails here.
func TestEveryPrivilegeHasAReason(t *testing.T) {
	pod, lines := daemonSetPod(t)
	grants := privileges(pod)
	if len(grants) == 0 {
		t.Fatal("no privilege found: the init container's privileged and the proxy's NET_ADMIN at least")
	}
	for _, g := range grants {
		if err := reasonAbove(lines, g); err != nil {
			t.Error(err)
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
	pod, _ := daemonSetPod(t)
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

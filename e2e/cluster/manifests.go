package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DeployManifests renders the kustomization in dir (deploy/, the default
// install, or an overlay such as deploy/ipvs) with kubectl kustomize, as
// `kubectl apply -k` does, and changes only the image (of the init
// container and the proxy) and the API server address.
func DeployManifests(ctx context.Context, kubectl, dir, image, apiServer string) (string, error) {
	all, err := output(ctx, kubectl, "kustomize", dir)
	if err != nil {
		return "", fmt.Errorf("deploy manifests: %w", err)
	}
	if n := strings.Count(all, deployImage); n != 2 {
		return "", fmt.Errorf("deploy manifests: %q occurs %d times, want 2 (the init container and the proxy)", deployImage, n)
	}
	return replaceOnce(strings.ReplaceAll(all, deployImage, "image: "+image), "deploy manifests", []struct{ old, new string }{
		{"server: https://API-SERVER:6443", "server: " + apiServer},
	})
}

// deployImage is the image line deploy/ and deploy/kubeadm ship.
const deployImage = "image: kube-nftproxy:latest"

// KubeadmProxyManifests are deploy/kubeadm/kube-proxy.yaml (kubeadm's
// kube-proxy objects, our image) with the image, the API server and the
// xtables lock's host path (a file under the cluster's directory rather
// than the host's /run, so Down leaves nothing behind) filled in.
func KubeadmProxyManifests(deployDir, image, apiServer, xtablesLock string) (string, error) {
	b, err := os.ReadFile(filepath.Join(deployDir, "kubeadm", "kube-proxy.yaml"))
	if err != nil {
		return "", err
	}
	return replaceOnce(string(b), "kubeadm manifests", []struct{ old, new string }{
		{"image: kube-nftproxy:latest", "image: " + image},
		{"server: https://API-SERVER:6443", "server: " + apiServer},
		{"path: /run/xtables.lock", "path: " + xtablesLock},
	})
}

// CleanupManifests are deploy/cleanup/daemonset.yaml with only its two
// images replaced: ours (the init container's --cleanup) and the pause
// image (the container that keeps the pod once it is done).
func CleanupManifests(deployDir, image, pause string) (string, error) {
	b, err := os.ReadFile(filepath.Join(deployDir, "cleanup", "daemonset.yaml"))
	if err != nil {
		return "", err
	}
	return replaceOnce(string(b), "cleanup manifests", []struct{ old, new string }{
		{deployImage, "image: " + image},
		{cleanupPauseImage, "image: " + pause},
	})
}

// cleanupPauseImage is the pause image line deploy/cleanup ships.
const cleanupPauseImage = "image: registry.k8s.io/pause:3.10.2"

// replaceOnce makes each replacement, each old string occurring exactly
// once in s.
func replaceOnce(s, what string, rs []struct{ old, new string }) (string, error) {
	for _, r := range rs {
		if n := strings.Count(s, r.old); n != 1 {
			return "", fmt.Errorf("%s: %q occurs %d times, want 1", what, r.old, n)
		}
		s = strings.Replace(s, r.old, r.new, 1)
	}
	return s, nil
}

// CoreDNSManifests are the objects kubeadm deploys for cluster DNS: RBAC,
// the Corefile, a two-replica Deployment, and Service kube-dns at
// dnsIPs (Layout.DNSServiceIPs: with two, the Service is dual-stack, so
// CoreDNS answers on a ClusterIP of each family).
func CoreDNSManifests(image string, dnsIPs []string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: ["endpoints", "services", "pods", "namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {
        errors
        health {
           lameduck 5s
        }
        ready
        kubernetes %[2]s in-addr.arpa ip6.arpa {
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }
        prometheus :9153
        forward . /etc/resolv.conf {
           max_concurrent 1000
        }
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 2
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      tolerations:
      - key: CriticalAddonsOnly
        operator: Exists
      - key: node-role.kubernetes.io/control-plane
        effect: NoSchedule
      nodeSelector:
        kubernetes.io/os: linux
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchExpressions:
                - key: k8s-app
                  operator: In
                  values: ["kube-dns"]
              topologyKey: kubernetes.io/hostname
      containers:
      - name: coredns
        image: %[1]s
        imagePullPolicy: IfNotPresent
        resources:
          limits:
            memory: 170Mi
          requests:
            cpu: 100m
            memory: 70Mi
        args: ["-conf", "/etc/coredns/Corefile"]
        volumeMounts:
        - name: config-volume
          mountPath: /etc/coredns
          readOnly: true
        ports:
        - containerPort: 53
          name: dns
          protocol: UDP
        - containerPort: 53
          name: dns-tcp
          protocol: TCP
        - containerPort: 9153
          name: metrics
          protocol: TCP
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add: ["NET_BIND_SERVICE"]
            drop: ["ALL"]
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet:
            path: /health
            port: 8080
            scheme: HTTP
          initialDelaySeconds: 60
          timeoutSeconds: 5
          successThreshold: 1
          failureThreshold: 5
        readinessProbe:
          httpGet:
            path: /ready
            port: 8181
            scheme: HTTP
      dnsPolicy: Default
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items:
          - key: Corefile
            path: Corefile
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/cluster-service: "true"
    kubernetes.io/name: CoreDNS
spec:
  selector:
    k8s-app: kube-dns
  clusterIP: %[3]s
%[4]s  ports:
  - name: dns
    port: 53
    protocol: UDP
  - name: dns-tcp
    port: 53
    protocol: TCP
  - name: metrics
    port: 9153
    protocol: TCP
`, image, ClusterDomain, dnsIPs[0], dualStackFields(dnsIPs))
}

// dualStackFields are a Service's fields for the ClusterIPs ips when
// there are two (else none: the Service stays as kubeadm writes it).
func dualStackFields(ips []string) string {
	if len(ips) < 2 {
		return ""
	}
	return fmt.Sprintf("  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [%q, %q]\n", ips[0], ips[1])
}

// SmokeManifests are the smoke check's workloads in namespace knp-smoke:
// an agnhost netexec backend pinned to each node behind Service "web"
// (ClusterIP) and "web-np" (NodePort), and a netexec client on the first
// node whose /dial endpoint makes requests from inside the pod. A
// dual-stack cluster adds "web6" (IPv6 alone) and makes web-np dual-stack.
func (l Layout) SmokeManifests(agnhost string) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: knp-smoke\n")
	pod := func(name, node, role string) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: knp-smoke
  labels:
    role: %s
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: netexec
    image: %s
    imagePullPolicy: IfNotPresent
    args: ["netexec", "--http-port=8080", "--udp-port=8081"]
    readinessProbe:
      httpGet:
        path: /healthz
        port: 8080
      periodSeconds: 1
`, name, role, node, agnhost)
	}
	for _, n := range l.Nodes {
		pod("web-"+n.Name, n.Name, "web")
	}
	pod("client", l.Nodes[0].Name, "client")
	b.WriteString(smokeService("web", ""))
	if l.Family == FamilyDual {
		b.WriteString(smokeService("web6", "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n"))
	}
	np := "  type: NodePort\n"
	if l.Family == FamilyDual {
		np += "  ipFamilyPolicy: RequireDualStack\n"
	}
	b.WriteString(smokeService("web-np", np))
	return b.String()
}

// smokeService is a smoke-check Service of the web pods' port 8080 on 80,
// with spec lines added (web6: the dual-stack check's Service of the second
// family alone, whose name resolves to an IPv6 ClusterIP only; web-np: the
// NodePort 30080).
func smokeService(name, spec string) string {
	nodePort := ""
	if strings.Contains(spec, "NodePort") {
		nodePort = "    nodePort: 30080\n"
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: knp-smoke
spec:
%s  selector:
    role: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
%s`, name, spec, nodePort)
}

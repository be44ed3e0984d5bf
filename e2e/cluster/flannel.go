package cluster

import "fmt"

// FlannelManifests run flanneld on every node (vxlan backend, kube subnet
// manager: each node's subnet is its spec.podCIDR). The nodes share one
// file system, so each flanneld writes its own subnet file
// (FlannelSubnetFile), which that node's CNI configuration names. The CNI
// configuration and plugin are the node's own (FlannelCNIConfig, the
// contract's cni/flannel), so no init container installs them. Flannel
// masquerades nothing (no traffic leaves the namespaces) and adds no
// FORWARD rules: kube-nftproxy stays the only one programming the node's
// netfilter for Services. netConf is flannel's net-conf.json
// (Layout.flannelNetConf).
func FlannelManifests(image, netConf string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata:
  name: flannel
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: flannel
rules:
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["nodes/status"]
  verbs: ["patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: flannel
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: flannel
subjects:
- kind: ServiceAccount
  name: flannel
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-flannel-cfg
  namespace: kube-system
data:
  net-conf.json: |
    %[2]s
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-flannel
  namespace: kube-system
  labels:
    k8s-app: flannel
spec:
  selector:
    matchLabels:
      k8s-app: flannel
  template:
    metadata:
      labels:
        k8s-app: flannel
    spec:
      serviceAccountName: flannel
      priorityClassName: system-node-critical
      hostNetwork: true
      tolerations:
      - operator: Exists
      containers:
      - name: kube-flannel
        image: %[1]s
        imagePullPolicy: IfNotPresent
        command: ["/opt/bin/flanneld"]
        args:
        - --kube-subnet-mgr
        - --iface=eth0
        - --ip-masq=false
        - --iptables-forward-rules=false
        - --subnet-file=/run/flannel/$(NODE_NAME)/subnet.env
        env:
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        securityContext:
          privileged: true
        resources:
          requests:
            cpu: 50m
            memory: 50Mi
        volumeMounts:
        - name: run
          mountPath: /run/flannel
        - name: cfg
          mountPath: /etc/kube-flannel/
      volumes:
      - name: run
        hostPath:
          path: /run/flannel
          type: DirectoryOrCreate
      - name: cfg
        configMap:
          name: kube-flannel-cfg
`, image, netConf)
}

// flannelNetConf is flannel's network configuration for the cluster's
// families: the pod range of each (flanneld takes each node's subnets
// from its spec.podCIDRs) on the vxlan backend; IPv6 single-stack turns
// IPv4 off.
func (l Layout) flannelNetConf() string {
	backend := `"Backend": {"Type": "vxlan"}`
	switch l.Family {
	case FamilyDual:
		return fmt.Sprintf(`{"Network": %q, "EnableIPv6": true, "IPv6Network": %q, %s}`, ClusterCIDR, ClusterCIDR6, backend)
	case FamilyIPv6:
		return fmt.Sprintf(`{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": %q, %s}`, ClusterCIDR6, backend)
	}
	return fmt.Sprintf(`{"Network": %q, %s}`, ClusterCIDR, backend)
}

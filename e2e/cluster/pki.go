package cluster

import (
	"os"
	"path/filepath"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/pki"
)

// certSpecs are the cluster's certificates: the API server's serving
// certificate and the clients' identities (the Node authorizer wants
// system:node:<name> in group system:nodes).
func (l Layout) certSpecs() []pki.Spec {
	specs := []pki.Spec{
		{File: "apiserver", CN: "kube-apiserver", Server: true,
			IPs: append(append(l.BridgeIPs(), l.kubernetesIPs()...), "127.0.0.1"),
			DNS: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc." + ClusterDomain}},
		{File: "apiserver-kubelet-client", CN: "kube-apiserver-kubelet-client", Orgs: []string{"system:masters"}},
		{File: "admin", CN: "admin", Orgs: []string{"system:masters"}},
		{File: "kube-controller-manager", CN: "system:kube-controller-manager"},
		{File: "kube-scheduler", CN: "system:kube-scheduler"},
	}
	for _, n := range l.Nodes {
		specs = append(specs, pki.Spec{File: "kubelet-" + n.Name, CN: "system:node:" + n.Name, Orgs: []string{"system:nodes"}})
	}
	return specs
}

// writePKI writes the CA (its key too: the controller-manager signs with
// it), every certificate of certSpecs and the service account signing key
// pair under Dir/pki, unless the CA already exists.
func (l Layout) writePKI() error {
	dir := filepath.Dir(l.pki("ca.crt"))
	if _, err := os.Stat(l.pki("ca.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := pki.NewCA("knp-cluster-ca", 365*24*time.Hour)
	if err != nil {
		return err
	}
	for _, s := range l.certSpecs() {
		if err := ca.Issue(dir, s); err != nil {
			return err
		}
	}
	if err := pki.WriteServiceAccountKeys(dir); err != nil {
		return err
	}
	// The CA last: its presence says the rest is there.
	return ca.Write(dir)
}

package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certSpec is one certificate the CA signs.
type certSpec struct {
	file   string // base name: <file>.crt and <file>.key
	cn     string
	orgs   []string
	server bool // serving certificate (else client)
	ips    []string
	dns    []string
}

// certSpecs are the cluster's certificates: the API server's serving
// certificate and the clients' identities (the Node authorizer wants
// system:node:<name> in group system:nodes).
func (l Layout) certSpecs() []certSpec {
	specs := []certSpec{
		{file: "apiserver", cn: "kube-apiserver", server: true,
			ips: []string{BridgeIP, KubernetesIP, "127.0.0.1"},
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc." + ClusterDomain}},
		{file: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{file: "admin", cn: "admin", orgs: []string{"system:masters"}},
		{file: "kube-controller-manager", cn: "system:kube-controller-manager"},
		{file: "kube-scheduler", cn: "system:kube-scheduler"},
	}
	for _, n := range l.Nodes {
		specs = append(specs, certSpec{file: "kubelet-" + n.Name, cn: "system:node:" + n.Name, orgs: []string{"system:nodes"}})
	}
	return specs
}

// writePKI writes the CA, every certificate of certSpecs and the service
// account signing key pair under Dir/pki, unless the CA already exists.
func (l Layout) writePKI() error {
	if _, err := os.Stat(l.pki("ca.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(l.pki("ca.crt")), 0o700); err != nil {
		return err
	}
	ca, caKey, err := newCA()
	if err != nil {
		return err
	}
	if err := writePEM(l.pki("ca.crt"), "CERTIFICATE", ca.Raw); err != nil {
		return err
	}
	if err := writeKey(l.pki("ca.key"), caKey); err != nil {
		return err
	}
	for _, s := range l.certSpecs() {
		if err := l.issue(s, ca, caKey); err != nil {
			return fmt.Errorf("certificate %s: %w", s.file, err)
		}
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(l.pki("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return err
	}
	return writePEM(l.pki("sa.pub"), "PUBLIC KEY", pub)
}

func newCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "knp-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func (l Layout) issue(s certSpec, ca *x509.Certificate, caKey *ecdsa.PrivateKey) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     s.dns,
	}
	if s.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	for _, ip := range s.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(l.pki(s.file+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(l.pki(s.file+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

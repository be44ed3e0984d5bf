package apiserver

import (
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"time"

	"github.com/kube-nftproxy/kube-nftproxy/e2e/internal/pki"
)

// serverPKI is the key material one Server uses, written under its directory.
type serverPKI struct {
	caPath               string
	caPEM                []byte
	certFile, keyFile    string
	saKeyFile, saPubFile string
}

// writePKI generates a CA, a serving certificate for 127.0.0.1 (and the
// names a client inside the cluster would use), and a service-account key
// pair, and writes them as PEM files in dir.
func writePKI(dir string) (*serverPKI, error) {
	ca, err := pki.NewCA("kube-nftproxy-e2e-ca", 7*24*time.Hour)
	if err != nil {
		return nil, err
	}
	if err := ca.Write(dir); err != nil {
		return nil, err
	}
	err = ca.Issue(dir, pki.Spec{
		File: "apiserver", CN: "kube-apiserver", Server: true,
		IPs: []string{"127.0.0.1", "::1", defaultKubernetesServiceIP}, // and the "kubernetes" Service
		DNS: []string{
			"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
		},
	})
	if err != nil {
		return nil, err
	}
	if err := pki.WriteServiceAccountKeys(dir); err != nil {
		return nil, err
	}
	return &serverPKI{
		caPath:    filepath.Join(dir, "ca.crt"),
		caPEM:     ca.PEM,
		certFile:  filepath.Join(dir, "apiserver.crt"),
		keyFile:   filepath.Join(dir, "apiserver.key"),
		saKeyFile: filepath.Join(dir, "sa.key"),
		saPubFile: filepath.Join(dir, "sa.pub"),
	}, nil
}

// randomToken returns 32 random hex digits.
func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

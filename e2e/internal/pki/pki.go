// Package pki makes the key material of the test API servers and the test
// cluster: a CA, certificates it signs, and a service-account key pair, all
// written as PEM files. Tests and test tooling only.
package pki

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

// CA signs certificates; PEM is its certificate, as written to ca.crt.
type CA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	validity time.Duration
	PEM      []byte
}

// NewCA makes a CA named cn whose certificates (its own too) are valid for
// validity, from an hour ago (clock skew between processes).
func NewCA(cn string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, validity: validity,
		PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Write writes the CA's certificate to dir/ca.crt and its key to dir/ca.key.
func (ca *CA) Write(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.PEM, 0o600); err != nil {
		return err
	}
	return WriteKey(filepath.Join(dir, "ca.key"), ca.key)
}

// Spec is one certificate the CA signs.
type Spec struct {
	File   string // base name: File.crt and File.key
	CN     string
	Orgs   []string
	Server bool // a serving certificate (else a client one)
	IPs    []string
	DNS    []string
}

// Issue signs a new key's certificate for s and writes both into dir.
func (ca *CA) Issue(dir string, s Spec) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.CN, Organization: s.Orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(ca.validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     s.DNS,
	}
	if s.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	for _, ip := range s.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", s.File, err)
	}
	if err := WritePEM(filepath.Join(dir, s.File+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return WriteKey(filepath.Join(dir, s.File+".key"), key)
}

// WriteServiceAccountKeys writes a new RSA key pair for signing service
// account tokens: dir/sa.key and dir/sa.pub.
func WriteServiceAccountKeys(dir string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := WritePEM(filepath.Join(dir, "sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return err
	}
	return WritePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
}

// WriteKey writes key as a PKCS #8 PEM file readable only by its owner.
func WriteKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return WritePEM(path, "PRIVATE KEY", der)
}

// WritePEM writes der as one PEM block of type typ, readable only by its owner.
func WritePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

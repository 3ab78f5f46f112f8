// Package testcert makes a throwaway certificate authority and certificates
// signed by it, for tests of TLS connections (to kfake, to a throwaway
// PostgreSQL cluster). Keys are ECDSA P-256; everything lives for a day.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	// File is the CA certificate written as PEM (what --tls-ca-file and
	// sslrootcert take).
	File string
	dir  string
}

// Pair is a certificate signed by a CA, and its key, as PEM files.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a CA named name whose files go to dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), dir: dir}
	ca.File = filepath.Join(dir, name+"-ca.pem")
	if err := os.WriteFile(ca.File, ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// MustCA is NewCA in t's temp dir.
func MustCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := NewCA(t.TempDir(), name)
	if err != nil {
		t.Fatalf("test CA: %v", err)
	}
	return ca
}

// Server issues a server certificate for the names (DNS names or IP
// addresses) and writes it and its key as name.pem and name-key.pem.
func (ca *CA) Server(name string, hosts ...string) (Pair, error) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth, hosts)
}

// Client issues a client certificate with common name name.
func (ca *CA) Client(name string) (Pair, error) {
	return ca.issue(name, x509.ExtKeyUsageClientAuth, nil)
}

func (ca *CA) issue(name string, usage x509.ExtKeyUsage, hosts []string) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	p := Pair{CertFile: filepath.Join(ca.dir, name+".pem"), KeyFile: filepath.Join(ca.dir, name+"-key.pem")}
	if err := os.WriteFile(p.CertFile, certPEM, 0o644); err != nil {
		return Pair{}, err
	}
	// PostgreSQL refuses a key file readable by others.
	if err := os.WriteFile(p.KeyFile, keyPEM, 0o600); err != nil {
		return Pair{}, err
	}
	if p.TLS, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return Pair{}, fmt.Errorf("test certificate %s: %w", name, err)
	}
	return p, nil
}

// MustServer is Server, failing t on error.
func (ca *CA) MustServer(t testing.TB, name string, hosts ...string) Pair {
	t.Helper()
	p, err := ca.Server(name, hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// MustClient is Client, failing t on error.
func (ca *CA) MustClient(t testing.TB, name string) Pair {
	t.Helper()
	p, err := ca.Client(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Pool is a cert pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

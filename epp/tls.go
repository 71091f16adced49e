package epp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"path/filepath"
	"time"
)

// The Inference Extension's own picker serves ext_proc over TLS by
// default, with a self-signed certificate (its --secure-serving), and the
// gateways are set up to connect so without verifying it: kvfast does the
// same, so that it drops in where that picker ran.

// SelfSignedTLS is a TLS configuration with a fresh self-signed
// certificate for the picker's Service names, valid for a year.
func SelfSignedTLS(names ...string) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot make a TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("cannot make a certificate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "kvfast-epp"}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("cannot make a self-signed certificate: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil
}

// CertDirTLS is a TLS configuration with the certificate and key in dir,
// as a Kubernetes TLS secret mounts them (tls.crt, tls.key).
func CertDirTLS(dir string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return nil, fmt.Errorf("cannot load the certificate in %s: %w", dir, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}}, nil
}

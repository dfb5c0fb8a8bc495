package rls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeSelfSigned writes a self-signed certificate for cn and its key.
func writeSelfSigned(t *testing.T, cert, key, cn string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{cn}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(k)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
}

// TestKeyPairRotation: the gRPC listener's certificate is read again when
// its files change (cert-manager rotating a Secret), and the last good
// pair is kept while the files are missing or half written.
func TestKeyPairRotation(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeSelfSigned(t, cert, key, "one.test")
	kp := &keyPair{cert: cert, key: key}
	cn := func() string {
		c, err := kp.get(nil)
		require.NoError(t, err)
		x, err := x509.ParseCertificate(c.Certificate[0])
		require.NoError(t, err)
		return x.Subject.CommonName
	}
	require.Equal(t, "one.test", cn())

	writeSelfSigned(t, cert, key, "two.test")
	// a modification time the first write may share: make it differ
	later := time.Now().Add(2 * time.Second)
	require.NoError(t, os.Chtimes(cert, later, later))
	require.Equal(t, "two.test", cn())

	// mid-rotation: the key does not match the certificate yet
	require.NoError(t, os.WriteFile(key, []byte("not a key"), 0o600))
	require.Equal(t, "two.test", cn())
	require.NoError(t, os.Remove(cert))
	require.Equal(t, "two.test", cn())

	// no pair at all at start: an error naming the variables
	_, err := (&keyPair{cert: cert, key: key}).get(nil)
	require.ErrorContains(t, err, "GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY")
}

package rendezvous

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// writeCert signs a certificate (by ca, or self-signed when ca is nil) and
// writes cert and key PEM files into dir.
func writeCert(t *testing.T, dir, name string, isCA bool, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: isCA, BasicConstraintsValid: true,
	}
	if !isCA {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	}
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return cert, key
}

// TestTLSClientCertsAndAuthFromRdzvConf: --rdzv-conf cacert/cert/key reach
// an etcd that requires client certificates, user/password one with auth
// enabled, and the wrong settings fail with a clear error.
func TestTLSClientCertsAndAuthFromRdzvConf(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := writeCert(t, dir, "ca", true, nil, nil, 0)
	writeCert(t, dir, "server", false, ca, caKey, x509.ExtKeyUsageServerAuth)
	writeCert(t, dir, "client", false, ca, caKey, x509.ExtKeyUsageClientAuth)

	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cu, _ := url.Parse("https://127.0.0.1:0")
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ClientTLSInfo.CertFile = filepath.Join(dir, "server.pem")
	cfg.ClientTLSInfo.KeyFile = filepath.Join(dir, "server-key.pem")
	cfg.ClientTLSInfo.TrustedCAFile = filepath.Join(dir, "ca.pem")
	cfg.ClientTLSInfo.ClientCertAuth = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.Close(); <-e.Server.StopNotify() }()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}
	ep := e.Clients[0].Addr().String()

	var c Config
	opts, err := ParseConf("cacert="+filepath.Join(dir, "ca.pem")+",cert="+filepath.Join(dir, "client.pem")+",key="+filepath.Join(dir, "client-key.pem"), &c)
	if err != nil {
		t.Fatal(err)
	}
	opts.DialTimeout = 15 * time.Second // TLS and bcrypt under -race on a loaded 2-core CI machine took over 3 s
	cli, err := NewClient([]string{ep}, opts)
	if err != nil {
		t.Fatalf("TLS with a client certificate: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}

	// Without a client certificate the server refuses: a clear error.
	noCert, _ := ParseConf("cacert="+filepath.Join(dir, "ca.pem"), &c)
	noCert.DialTimeout = 2 * time.Second
	if _, err := NewClient([]string{ep}, noCert); err == nil || !strings.Contains(err.Error(), "check --rdzv-endpoint") {
		t.Errorf("no client certificate: %v", err)
	}

	// user/password: enable auth, then only the right password works.
	if _, err := cli.UserAdd(ctx, "root", "s3cret"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	withAuth, err := ParseConf("cacert="+filepath.Join(dir, "ca.pem")+",cert="+filepath.Join(dir, "client.pem")+",key="+filepath.Join(dir, "client-key.pem")+",user=root,password=s3cret", &c)
	if err != nil {
		t.Fatal(err)
	}
	withAuth.DialTimeout = 15 * time.Second
	acli, err := NewClient([]string{ep}, withAuth)
	if err != nil {
		t.Fatalf("user/password: %v", err)
	}
	defer acli.Close()
	if _, err := acli.Get(ctx, "/k"); err != nil {
		t.Errorf("authenticated read: %v", err)
	}
	wrong := withAuth
	wrong.Password = "nope"
	if wc, err := NewClient([]string{ep}, wrong); err == nil {
		wc.Close()
		t.Error("a wrong password was accepted")
	}
}

package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/user"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
)

// requester says who this elasticctl speaks for, for a spec's RequestedBy
// (the coordinator names them in the decisions their change causes): the
// etcd user (by password, or a client certificate's common name, which
// etcd takes as the user), else the local user.
func requester(c *cli.Context) string {
	if opts, _, err := connection(c); err == nil {
		if who := etcdUser(opts); who != "" {
			return "etcd user " + who
		}
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "user " + u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return "user " + u
	}
	return ""
}

// etcdUser is the etcd user opts authenticate as: User, else the common
// name of the client certificate ("" when neither says).
func etcdUser(opts etcdconn.Options) string {
	if opts.User != "" {
		return opts.User
	}
	if opts.Cert == "" {
		return ""
	}
	b, err := os.ReadFile(opts.Cert)
	if err != nil {
		return ""
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return ""
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return ""
	}
	return cert.Subject.CommonName
}

package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/cluster"
	"github.com/kjob/kjob/messages"
)

// tlsFiles are the global --tls-ca, --tls-cert and --tls-key.
var tlsFiles cluster.TLSFiles

func addTLSFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	f.StringVar(&tlsFiles.CA, "tls-ca", os.Getenv("KJOB_TLS_CA"), "PEM file of the cluster's CA certificate: with --tls-cert and --tls-key, talk to the cluster over mutual TLS (env KJOB_TLS_CA)")
	f.StringVar(&tlsFiles.Cert, "tls-cert", os.Getenv("KJOB_TLS_CERT"), "PEM file of this endpoint's certificate, signed by the CA (env KJOB_TLS_CERT)")
	f.StringVar(&tlsFiles.Key, "tls-key", os.Getenv("KJOB_TLS_KEY"), "PEM file of this endpoint's private key (env KJOB_TLS_KEY)")
}

// clusterTLS is the TLS the flags name, nil for none.
func clusterTLS() (*cluster.TLS, error) { return cluster.LoadTLS(tlsFiles) }

func tlsCmd() *cobra.Command {
	c := &cobra.Command{Use: "tls", Short: "make a CA and certificates for a cluster's mutual TLS (--tls-ca, --tls-cert, --tls-key)"}
	var dir, hosts string
	var days int
	initCmd := &cobra.Command{Use: "init", Args: cobra.NoArgs,
		Short: "make a CA (ca.pem, ca-key.pem) and a first certificate (kjob.pem, kjob-key.pem) in --dir",
		Long: `Makes a cluster's certificate authority and one certificate it signed, usable by
servers, clients and workers alike. Give every endpoint ca.pem and a certificate
(this one, or one of its own from "kjob tls issue"), and keep ca-key.pem off the
machines: whoever holds it can make members of the cluster. Copy single files out
of --dir, never the directory. Use a CA for this cluster alone: every certificate
the CA file admits is a member.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkDays(days); err != nil {
				return err
			}
			// Only its owner reads it: it holds the CA's key.
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return invalid("dir", "%v", err)
			}
			if err := notThere(dir, "ca.pem", "ca-key.pem", "kjob.pem", "kjob-key.pem"); err != nil {
				return err
			}
			ca, err := cluster.NewCA("kjob cluster CA", 10*365*24*time.Hour)
			if err != nil {
				return err
			}
			key, err := ca.KeyPEM()
			if err != nil {
				return err
			}
			if err := writeNew(filepath.Join(dir, "ca-key.pem"), key, 0o600); err != nil {
				return err
			}
			if err := writeNew(filepath.Join(dir, "ca.pem"), ca.CertPEM(), 0o644); err != nil {
				return err
			}
			return issueTo(ca, dir, "kjob", hosts, days, cluster.RoleAny)
		}}
	issue := &cobra.Command{Use: "issue", Args: cobra.NoArgs,
		Short: "make a certificate NAME.pem, NAME-key.pem signed by the CA in --dir",
		RunE: func(cmd *cobra.Command, _ []string) error {
			name, _ := cmd.Flags().GetString("name")
			if !certName.MatchString(name) {
				return invalid("name", "%q: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
			}
			if err := checkDays(days); err != nil {
				return err
			}
			certPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
			if err != nil {
				return invalid("dir", "no CA here (kjob tls init makes one): %v", err)
			}
			keyPEM, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
			if err != nil {
				return invalid("dir", "no CA key here: %v", err)
			}
			ca, err := cluster.ParseCA(certPEM, keyPEM)
			if err != nil {
				return invalid("dir", "ca.pem and ca-key.pem: %v", err)
			}
			roleName, _ := cmd.Flags().GetString("role")
			role, err := cluster.ParseRole(roleName)
			if err != nil {
				return err
			}
			apps, _ := cmd.Flags().GetStringSlice("app")
			if err := notThere(dir, name+".pem", name+"-key.pem"); err != nil {
				return err
			}
			return issueTo(ca, dir, name, hosts, days, role, apps...)
		}}
	issue.Flags().String("name", "", "the certificate's name: its files are NAME.pem and NAME-key.pem (required)")
	issue.Flags().StringSlice("app", nil, "with --role worker: the apps the worker's certificate is bound to (repeat, or comma-separated); it may register and report results for those only (none: any app)")
	issue.Flags().String("role", "", "what the certificate may do: client (commands and reads), worker (register, run jobs, report results) or server; none: anything, as a server's")
	for _, sub := range []*cobra.Command{initCmd, issue} {
		sub.Flags().StringVar(&dir, "dir", "kjob-tls", "directory of the CA's files")
		sub.Flags().StringVar(&hosts, "hosts", "localhost,127.0.0.1,::1", "comma-separated host names and IP addresses the certificate names, for HTTPS clients of the admin API that check them (the cluster's own connections check only the CA's signature)")
		sub.Flags().IntVar(&days, "days", 365, "days the certificate is valid (at most the CA's 10 years)")
	}
	c.AddCommand(initCmd, issue)
	return c
}

var certName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func checkDays(days int) error {
	if days < 1 || days > 10*365 {
		return invalid("days", "%d: 1 to %d", days, 10*365)
	}
	return nil
}

func issueTo(ca *cluster.CA, dir, name, hosts string, days int, role cluster.Role, apps ...string) error {
	certPEM, keyPEM, err := ca.Issue(name, splitList(hosts), time.Duration(days)*24*time.Hour, role, apps...)
	if err != nil {
		return err
	}
	key, cert := filepath.Join(dir, name+"-key.pem"), filepath.Join(dir, name+".pem")
	if err := writeNew(key, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(cert, certPEM, 0o644); err != nil {
		return err
	}
	leaf, _ := pem.Decode(certPEM)
	until := "?"
	if c, err := x509.ParseCertificate(leaf.Bytes); err == nil {
		until = c.NotAfter.UTC().Format(time.RFC3339)
	}
	fmt.Printf("wrote %s (valid until %s) and %s\nuse: --tls-ca %s --tls-cert %s --tls-key %s\n", cert, until, key,
		filepath.Join(dir, "ca.pem"), cert, key)
	return nil
}

// notThere refuses to overwrite any of names in dir.
func notThere(dir string, names ...string) error {
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err == nil {
			return &kerr.Error{Code: messages.Code_ALREADY_EXISTS, Field: "dir", Message: fmt.Sprintf("%s exists: not overwritten", p)}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return invalid("dir", "%v", err)
		}
	}
	return nil
}

func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return invalid("dir", "%v", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

"""Certificates for railyardd's peer-plane mutual TLS, made at test time by scripts/peer-certs.sh
(the openssl CLI), and the daemon flags that use them. One directory is one cluster CA; two
directories are two CAs that do not trust each other."""

import os
import subprocess

PEER_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "peer-certs.sh")


def make_certs(certdir, *specs):
    """Makes (or keeps: the script is idempotent) the CA in certdir and a certificate per spec:
    "NODE" (DNS:NODE, IP:127.0.0.1) or "NODE=IP,IP". AssertionError with the script's output on
    failure."""
    out = subprocess.run([PEER_CERTS, certdir, *specs], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, f"peer-certs.sh {certdir} {' '.join(specs)}: {out.stderr}"
    return certdir


def tls_flags(certdir, node, ca_dir=None):
    """railyardd's --peer_tls_* flags for `node`'s certificate in certdir, trusting ca_dir's CA
    (certdir's by default)."""
    return [f"--peer_tls_cert={certdir}/{node}.pem", f"--peer_tls_key={certdir}/{node}-key.pem",
            f"--peer_tls_ca={ca_dir or certdir}/ca.pem"]

"""TLS for tests: a throwaway CA and certificates, for Apache Kafka's own SSL listeners
(``apache_kafka.py``). Certificates are made with the ``openssl`` command-line tool.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from ingest.errors import HarnessError

__all__ = ["CertificateAuthority", "make_certificates"]


@dataclass(frozen=True)
class CertificateAuthority:
    """Files of a test PKI: the CA, a server certificate and a client certificate."""

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=cwd, timeout=60)
    if result.returncode != 0:
        raise HarnessError(f"openssl {args[0]} failed: {result.stderr[-2000:]}")


def _issue(directory: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions)
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(ext_file),
        "-out", str(cert), cwd=directory,
    )  # fmt: skip
    return cert, key


def make_certificates(
    directory: Path, *, server_names: tuple[str, ...] = ("localhost",)
) -> CertificateAuthority:
    """A CA plus a server certificate for ``server_names`` (DNS names only) and a
    client certificate, all signed by the CA and valid for two days."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-sha256",
        "-subj", "/CN=ingest test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
        cwd=directory,
    )  # fmt: skip
    common = (
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    alt_names = ",".join(f"DNS:{name}" for name in server_names)
    server_cert, server_key = _issue(
        directory,
        "server",
        f"/CN={server_names[0]}",
        common + f"extendedKeyUsage=serverAuth\nsubjectAltName={alt_names}\n",
    )
    client_cert, client_key = _issue(
        directory, "client", "/CN=ingest-test-client", common + "extendedKeyUsage=clientAuth\n"
    )
    return CertificateAuthority(
        directory=directory,
        ca_cert=directory / "ca.pem",
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
    )

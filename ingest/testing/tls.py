"""TLS for tests: a throwaway CA, certificates, and a socat TLS terminator.

``TlsTerminator`` puts TLS (optionally requiring a client certificate) in
front of a plain TCP port, the way a load balancer or sidecar would in a real
deployment. socat comes from the system's packages (Debian: ``apt-get install socat``);
nothing here installs it: ``socat_binary`` raises ``HarnessError`` naming the package when
it is missing, and the tests that need it skip with that reason.
Certificates are made with the ``openssl`` command-line tool.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ingest.embedded.managed import ManagedProcess, ProcessServer, free_port, wait_until
from ingest.embedded.tansu import TansuBroker
from ingest.errors import HarnessError

__all__ = [
    "AdvertisedBroker",
    "CertificateAuthority",
    "TlsTerminator",
    "make_certificates",
    "socat_binary",
]


def socat_binary() -> str:
    """The socat binary; HarnessError when it is not installed."""
    found = shutil.which("socat")
    if not found:
        raise HarnessError("socat is not installed (Debian: apt-get install socat)")
    return found


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


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class TlsTerminator(ProcessServer):
    """socat on 127.0.0.1:``port`` speaking TLS, forwarding plain TCP to ``target_port``.

    With ``require_client_cert`` the terminator refuses clients without a
    certificate signed by the CA (mutual TLS).
    """

    def __init__(
        self,
        target_port: int,
        certificates: CertificateAuthority,
        *,
        port: int | None = None,
        require_client_cert: bool = True,
    ) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.certificates = certificates
        verify = f"verify=1,cafile={certificates.ca_cert}" if require_client_cert else "verify=0"
        listen = (
            f"OPENSSL-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork,"
            f"cert={certificates.server_cert},key={certificates.server_key},{verify}"
        )
        self.stop_timeout = 3.0
        self.process = ManagedProcess(
            f"socat tls :{self.port} -> :{target_port}",
            [socat_binary(), "-d", listen, f"TCP:127.0.0.1:{target_port}"],
            dict(os.environ),
            certificates.directory / f"socat-{self.port}.log",
            cwd=certificates.directory,
        )

    def start(self) -> TlsTerminator:
        self.process.start()
        try:
            wait_until(lambda: _accepts(self.port), timeout=10, what=f"{self.process.name}")
        except HarnessError:
            self.process.stop(timeout=2)
            raise
        return self

    def __repr__(self) -> str:
        return f"TlsTerminator(:{self.port} -> :{self.target_port})"


class AdvertisedBroker(TansuBroker):
    """A TansuBroker whose Metadata advertises ``advertised_url`` (e.g. a TLS terminator's
    address) instead of its own listener, as a broker behind a proxy would."""

    def __init__(self, *, advertised_url: str, **kwargs: object) -> None:
        self.advertised_url = advertised_url
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def _argv(self) -> list[str]:
        return [
            f"--kafka-advertised-listener-url={self.advertised_url}"
            if arg.startswith("--kafka-advertised-listener-url=")
            else arg
            for arg in super()._argv()
        ]

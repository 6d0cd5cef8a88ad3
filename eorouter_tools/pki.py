"""A throwaway PKI for TLS tests and benchmarks, made with the openssl command line: a CA, a
server certificate for 127.0.0.1/localhost, client certificates, and router
certificates whose common name is a router id."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    def __init__(self, directory: Path):
        if shutil.which("openssl") is None:
            raise RuntimeError("the TLS tests need the openssl command")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = self.dir / "ca.pem"
        _run(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=eorouter-test-ca",
            cwd=self.dir,
        )

    def issue(
        self, name: str, common_name: str, sans: tuple[str, ...] = (), password: str | None = None, ca: Path | None = None
    ) -> tuple[Path, Path]:
        """(certificate, key) for ``common_name``, signed by this CA (or ``ca``'s key
        beside it); the key encrypted with ``password`` when given."""
        key, csr, cert = f"{name}.key", f"{name}.csr", f"{name}.pem"
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={common_name}", cwd=self.dir)
        ext = self.dir / f"{name}.ext"
        ext.write_text(f"subjectAltName={','.join(sans)}\n" if sans else "basicConstraints=CA:FALSE\n")
        ca_pem = ca or self.ca
        _run(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            str(ca_pem),
            "-CAkey",
            str(ca_pem.with_suffix(".key")),
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            str(ext),
            cwd=self.dir,
        )
        if password is not None:
            _run("pkey", "-in", key, "-out", f"{name}.enc.key", "-aes256", "-passout", f"pass:{password}", cwd=self.dir)
            (self.dir / f"{name}.password").write_text(password + "\n")
            return self.dir / cert, self.dir / f"{name}.enc.key"
        return self.dir / cert, self.dir / key

    def expired(self, name: str, common_name: str, sans: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """(certificate, key) for ``common_name`` signed by this CA, valid only on 1 January 2020:
        ``openssl ca``, which takes explicit dates, with a throwaway database beside the CA."""
        key, csr, cert = f"{name}.key", f"{name}.csr", f"{name}.pem"
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={common_name}", cwd=self.dir)
        (self.dir / "index.txt").touch()
        ext = f"subjectAltName={','.join(sans)}" if sans else "basicConstraints=CA:FALSE"
        (self.dir / "ca.cnf").write_text(
            "[ca]\ndefault_ca = ca_default\n[ca_default]\ndatabase = index.txt\nnew_certs_dir = .\n"
            "rand_serial = yes\ndefault_md = sha256\npolicy = any\nunique_subject = no\nx509_extensions = ext\n"
            f"[any]\ncommonName = supplied\n[ext]\n{ext}\n"
        )
        _run(
            "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", csr, "-out", cert,
            "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext",
            cwd=self.dir,
        )  # fmt: skip
        return self.dir / cert, self.dir / key

    def server(self) -> tuple[Path, Path]:
        return self.issue("server", "localhost", ("DNS:localhost", "IP:127.0.0.1"))


def other_ca(directory: Path) -> Pki:
    """A second, unrelated CA: its certificates must not be trusted."""
    return Pki(directory)

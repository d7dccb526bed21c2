"""A throwaway self-signed certificate and key (openssl), for tests of TLS settings."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pem:
    ca: Path  # a self-signed certificate, usable as CA file or client certificate
    key: Path  # its private key


def self_signed(folder: Path, name: str = "test") -> Pem:
    """A certificate for CN=`name`, valid one day, and its unencrypted key, in `folder`."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
         "-days", "1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return Pem(ca=cert, key=key)

"""TLS for the gRPC and HTTP ports: certificates read once at start-up.

gRPC takes tritonserver's flags (`--grpc-use-ssl`, `--grpc-use-ssl-mutual`,
`--grpc-server-cert`, `--grpc-server-key`, `--grpc-root-cert`); HTTPS, which
Triton leaves to a proxy, takes the same flags with `--http-` in front. A
certificate or key that is missing, unreadable or does not match is a start-up
error in one line: the server never falls back to plaintext.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


class TlsError(ValueError):
    """TLS cannot be set up as asked (one line, for the start-up error)."""


@dataclass(frozen=True)
class TlsFiles:
    """One port's TLS settings: the server's certificate chain and key (PEM), and
    for mutual TLS the root certificates client certificates must chain to."""

    port_name: str  # "gRPC" or "HTTP", for messages
    cert: str
    key: str
    root: str = ""
    mutual: bool = False

    def check(self) -> None:
        """Every file needed is named and readable; a TlsError otherwise."""
        flag = "--grpc" if self.port_name == "gRPC" else "--http"
        needed = [("server certificate", self.cert, f"{flag}-server-cert"),
                  ("server key", self.key, f"{flag}-server-key")]
        if self.mutual:
            needed.append(("root certificate", self.root, f"{flag}-root-cert"))
        for what, path, option in needed:
            if not path:
                raise TlsError(f"{self.port_name} TLS needs a {what}: set {option}")
            _read(path, f"{self.port_name} TLS {what}")
        if self.root and not self.mutual:
            _read(self.root, f"{self.port_name} TLS root certificate")

    def pem(self) -> tuple[bytes, bytes, bytes | None]:
        """(certificate chain, key, root certificates or None), as grpcio takes them."""
        self.check()
        root = _read(self.root, "root certificate") if self.mutual else None
        return _read(self.cert, "certificate"), _read(self.key, "key"), root


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise TlsError(f"cannot read the {what} '{path}': {error.strerror}") from None


def server_context(files: TlsFiles, alpn: list[str]) -> ssl.SSLContext:
    """A server-side SSLContext for `files`, offering the `alpn` protocols (gRPC: h2,
    as RFC 9113 and the gRPC spec require; HTTP: http/1.1). TLS 1.2 at least."""
    files.check()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as error:
        raise TlsError(f"{files.port_name} TLS: the server certificate '{files.cert}' and key "
                       f"'{files.key}' cannot be used: {_reason(error)}") from None
    if files.mutual:
        try:
            context.load_verify_locations(cafile=files.root)
        except (ssl.SSLError, OSError) as error:
            raise TlsError(f"{files.port_name} TLS: the root certificate '{files.root}' cannot "
                           f"be used: {_reason(error)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(alpn)
    return context


def _reason(error: Exception) -> str:
    return getattr(error, "reason", None) or getattr(error, "strerror", None) or str(error)

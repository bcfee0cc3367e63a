"""TLS on the gRPC port (both transports) and HTTPS on the HTTP port, with stock
tritonclient, certificates made by the test; mutual TLS refusing clients without
a trusted certificate; bad certificate files stop the server in one line."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.frontends.tls import TlsFiles
from mini_triton.server import ServerThread
from test_lifecycle import write_model

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _name(common_name: str):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key, issuer_name, issuer_key, ca: bool, sans=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(folder: Path, stem: str, certificate, key) -> tuple[Path, Path]:
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def make_pki(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate from
    the CA and one from a CA the server does not trust."""
    paths = {}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, _name("test CA"), ca_key, ca=True)
    paths["ca"], _ = _write(folder, "ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("localhost", server_key, ca.subject, ca_key, ca=False, sans=[
        x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    paths["server_cert"], paths["server_key"] = _write(folder, "server", server, server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("client", client_key, ca.subject, ca_key, ca=False)
    paths["client_cert"], paths["client_key"] = _write(folder, "client", client, client_key)
    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue_ca = _certificate("rogue CA", rogue_key, _name("rogue CA"), rogue_key, ca=True)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _certificate("stranger", stranger_key, rogue_ca.subject, rogue_key, ca=False)
    paths["stranger_cert"], paths["stranger_key"] = _write(folder, "stranger", stranger,
                                                           stranger_key)
    return paths


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls_repo")
    write_model(folder, "m")
    return folder


def tls(pki, port_name: str, mutual: bool = False) -> TlsFiles:
    return TlsFiles(port_name, str(pki["server_cert"]), str(pki["server_key"]),
                    str(pki["ca"]), mutual)


def serve(repository, pki, mutual=False, transport="native") -> ServerThread:
    return ServerThread(server_settings(repository, grpc_tls=tls(pki, "gRPC", mutual),
                                        http_tls=tls(pki, "HTTP", mutual),
                                        grpc_transport=transport, allow_metrics=False))


def infer(module, client) -> None:
    data = np.arange(1 << 14, dtype=np.float32).reshape(1, -1)  # 64 KiB: several records
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("m", [tensor]).as_numpy("OUTPUT0"), data)


def grpc_client(server, pki, cert: str | None = None) -> grpcclient.InferenceServerClient:
    extra = {} if cert is None else {"private_key": str(pki[f"{cert}_key"]),
                                     "certificate_chain": str(pki[f"{cert}_cert"])}
    return grpcclient.InferenceServerClient(f"localhost:{server.ports['grpc']}", ssl=True,
                                            root_certificates=str(pki["ca"]), **extra)


def http_client(server, pki, cert: str | None = None) -> httpclient.InferenceServerClient:
    options = {"ca_certs": str(pki["ca"])}
    if cert is not None:
        options.update(certfile=str(pki[f"{cert}_cert"]), keyfile=str(pki[f"{cert}_key"]))
    return httpclient.InferenceServerClient(f"localhost:{server.ports['http']}", ssl=True,
                                            ssl_options=options, network_timeout=10)


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_grpc_over_tls_with_stock_client(repository, pki, transport):
    with serve(repository, pki, transport=transport) as server:
        client = grpc_client(server, pki)
        assert client.is_server_ready()
        infer(grpcclient, client)
        client.close()
        plain = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=3)
        plain.close()


def test_native_grpc_tls_negotiates_h2(repository, pki):
    with serve(repository, pki) as server:
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        context.set_alpn_protocols(["h2"])
        with socket.create_connection(("127.0.0.1", server.ports["grpc"]), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as wrapped:
                assert wrapped.selected_alpn_protocol() == "h2"


def test_https_with_stock_client(repository, pki):
    with serve(repository, pki) as server:
        client = http_client(server, pki)
        assert client.is_server_ready()
        infer(httpclient, client)
        client.close()
        with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=5) as raw:
            raw.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            raw.settimeout(5)
            assert not raw.recv(1024).startswith(b"HTTP/1.1 200")  # no plaintext answer


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_mutual_tls_grpc_refuses_clients_without_a_trusted_certificate(repository, pki,
                                                                       transport):
    with serve(repository, pki, mutual=True, transport=transport) as server:
        for cert in (None, "stranger"):
            client = grpc_client(server, pki, cert)
            with pytest.raises(InferenceServerException):
                client.is_server_live(client_timeout=5)
            client.close()
        client = grpc_client(server, pki, "client")
        infer(grpcclient, client)
        client.close()


def test_mutual_tls_http_refuses_clients_without_a_trusted_certificate(repository, pki):
    with serve(repository, pki, mutual=True) as server:
        for cert in (None, "stranger"):
            client = http_client(server, pki, cert)
            with pytest.raises(Exception):
                client.is_server_live()
            client.close()
        client = http_client(server, pki, "client")
        infer(httpclient, client)
        client.close()


@pytest.mark.parametrize("flags, message", [
    (["--grpc-use-ssl=true"], "gRPC TLS needs a server certificate: set --grpc-server-cert"),
    (["--grpc-use-ssl=true", "--grpc-server-cert={missing}", "--grpc-server-key={key}"],
     "cannot read the gRPC TLS server certificate"),
    (["--http-use-ssl=true", "--http-server-cert={ca}", "--http-server-key={key}"],
     "HTTP TLS: the server certificate"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert={cert}", "--grpc-server-key={key}"],
     "gRPC TLS needs a root certificate: set --grpc-root-cert"),
])
def test_bad_certificate_files_stop_the_server_in_one_line(repository, pki, tmp_path, flags,
                                                            message):
    values = {"missing": tmp_path / "nope.pem", "key": pki["server_key"],
              "cert": pki["server_cert"], "ca": pki["ca"]}
    command = [sys.executable, "-m", "mini_triton", f"--model-repository={repository}",
               "--http-port=0", "--grpc-port=0", "--metrics-port=0",
               *[flag.format(**values) for flag in flags]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and message in errors[0], done.stderr
    assert "Started" not in done.stderr

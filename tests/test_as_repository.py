"""as:// model repositories against Azurite (Azure's own storage emulator), driven by
the real mini_triton server with stock tritonclient.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cloud_repositories import _spec, clients, start_failure, stop_emulator
from cloud_repositories import mount  # noqa: F401 (a fixture)
from conftest import free_port
from serverproc import ServerProcess
from test_lifecycle import IDENTITY, echo, wait_until


# --- as:// against Azurite (Azure's own storage emulator, from npm) ---
#
# Azurite comes from npm with the interop tools (tests/interop/package.json, installed
# by deploy/install_test_tools.sh): outside CI the tests skip without it, in CI they fail.
# The client reaches it through AZURE_STORAGE_CONNECTION_STRING; the account-key and
# managed-identity paths to *.blob.core.windows.net are untested.

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")  # the emulator's published development key


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    import shutil

    from interop.tools import HERE as INTEROP, require_tool

    local = INTEROP / "node_modules" / ".bin" / "azurite-blob"
    program = os.environ.get("AZURITE_BLOB") or (str(local) if local.exists() else None) \
        or shutil.which("azurite-blob")
    require_tool(bool(program) and _spec("azure.storage.blob") is not None,
                 "azurite-blob (npm, tests/interop) or azure-storage-blob "
                 "(pip install 'mini-triton[azure]') is not installed")
    port = free_port()
    tmp = tmp_path_factory.mktemp("azurite")
    log = open(tmp / "azurite.log", "w")
    proc = subprocess.Popen([program, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--inMemoryPersistence", "--disableTelemetry", "--silent",
                             "--skipApiVersionCheck"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError("azurite exited:\n" + (tmp / "azurite.log").read_text())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("azurite did not start") from None
            time.sleep(0.05)
    yield endpoint
    stop_emulator(proc, log)


def azure_connection(endpoint: str, key: str = AZURITE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={endpoint};")


def azure_env(endpoint: str, mount: Path | None = None, key: str = AZURITE_KEY) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "TRITON_AZURE_"))}
    env["AZURE_STORAGE_CONNECTION_STRING"] = azure_connection(endpoint, key)
    if mount is not None:
        env["TRITON_AZURE_MOUNT_DIRECTORY"] = str(mount)
    return env


@pytest.fixture
def container(azurite):
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(azure_connection(azurite))
    return service.create_container(f"models-{uuid.uuid4().hex[:12]}")


def azure_put_model(container, name: str, versions=(1,)) -> None:
    container.upload_blob(f"repo/{name}/config.pbtxt", IDENTITY.format(name=name, extra=""),
                          overwrite=True)
    for version in versions:
        container.upload_blob(f"repo/{name}/{version}/weights", b"\x00" * 16, overwrite=True)


def test_as_poll_mode_follows_the_container(azurite, container, mount):
    azure_put_model(container, "z")
    url = f"as://{AZURITE_ACCOUNT}/{container.container_name}/repo"
    args = [f"--model-repository={url}", "--model-control-mode=poll", "--repository-poll-secs=1"]
    with ServerProcess(args, env=azure_env(azurite, mount)) as server:
        http, grpc = clients(server)
        assert echo(http, "z") == "1" and echo(grpc, "z") == "1"
        container.upload_blob("repo/z/2/weights", b"v2")
        wait_until(lambda: echo(grpc, "z") == "2", what="version 2 served")
        for blob in list(container.list_blobs(name_starts_with="repo/z/")):
            container.delete_blob(blob.name)
        wait_until(lambda: not http.client.is_model_ready("z"), what="model unloaded")
        for protocol in (http, grpc):
            protocol.client.close()
        server.stop()
    assert list(mount.iterdir()) == []


def test_as_missing_container_and_bad_key_stop_the_server_in_one_line(azurite, container):
    missing = f"as://{AZURITE_ACCOUNT}/no-such-container/repo"
    status, errors = start_failure([f"--model-repository={missing}"], azure_env(azurite))
    assert status == 1 and len(errors) == 1, errors
    assert missing in errors[0] and "container 'no-such-container' does not exist" in errors[0]

    azure_put_model(container, "z")
    url = f"as://{AZURITE_ACCOUNT}/{container.container_name}/repo"
    wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ=="
    status, errors = start_failure([f"--model-repository={url}"],
                                   azure_env(azurite, key=wrong))
    assert status == 1 and len(errors) == 1, errors
    assert url in errors[0] and "access denied, check the credentials" in errors[0]
    assert "AuthorizationFailure" in errors[0] and wrong not in errors[0]

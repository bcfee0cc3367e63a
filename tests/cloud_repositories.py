"""What the cloud-repository tests share: moto's standalone S3 server (a module fixture,
one per test module that uses it) with a bucket and a mount folder, the environment a
server needs to reach it, objects put and deleted, and starting a server that must fail.

Outside CI a missing moto or boto3 skips these tests with the way to install them;
in CI (CI=true) it fails them instead, so a broken install can never pass as a skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, connect, free_port
from test_lifecycle import IDENTITY


INSTALL = "pip install -e '.[test]' (moto[server] and boto3)"
REGION = "us-east-1"
ALLOW_ALL = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def require_s3_tools() -> None:
    """Skip (outside CI) or fail (CI=true) when moto or boto3 is missing."""
    missing = [name for name in ("boto3", "moto") if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must install them ({INSTALL})", pytrace=False)
    pytest.skip(f"{reason} (install with {INSTALL})")


class MotoServer:
    """moto's standalone server as a child process; authentication is enforced after
    the first three calls, which make the two IAM users the tests use."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="6", MOTO_PORT=str(self.port))
        self.log = open(tmp / "moto.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("moto server exited:\n" + (tmp / "moto.log").read_text())
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.05)
        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, region_name=REGION,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        self.keys = {}
        for user in ("admin", "server"):  # six unauthenticated calls, then auth is on
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=ALLOW_ALL)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            self.keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])

    def client(self, service: str = "s3", user: str = "admin"):
        import boto3

        key_id, secret = self.keys[user]
        return boto3.client(service, endpoint_url=self.url, region_name=REGION,
                            aws_access_key_id=key_id, aws_secret_access_key=secret)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    require_s3_tools()
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def s3(moto):
    return moto.client()


@pytest.fixture
def bucket(s3):
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def mount(tmp_path):
    folder = tmp_path / "mount"
    folder.mkdir()
    return folder


def server_env(moto, mount: Path | None = None, user: str = "server", secret: str | None = None,
               key_id: str | None = None) -> dict:
    """The environment the AWS tools read, and nothing of this machine's own AWS setup."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "TRITON_AWS_"))}
    real_id, real_secret = moto.keys[user]
    env.update(AWS_ACCESS_KEY_ID=key_id or real_id,
               AWS_SECRET_ACCESS_KEY=secret or real_secret,
               AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    if mount is not None:
        env["TRITON_AWS_MOUNT_DIRECTORY"] = str(mount)
    return env


def put_model(s3, bucket: str, prefix: str, name: str, versions=(1,), marker=False) -> None:
    """A model folder in the bucket: config.pbtxt and each version as a file in the
    version folder (or, with marker, as the empty 'N/' object a console makes)."""
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}/config.pbtxt",
                  Body=IDENTITY.format(name=name, extra="").encode())
    for version in versions:
        key = f"{prefix}/{name}/{version}/" if marker else f"{prefix}/{name}/{version}/weights"
        s3.put_object(Bucket=bucket, Key=key, Body=b"" if marker else b"\x00" * 16)


def delete_prefix(s3, bucket: str, prefix: str) -> None:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    for item in listed:
        s3.delete_object(Bucket=bucket, Key=item["Key"])


def repository_url(moto, bucket: str, prefix: str = "repo") -> str:
    return f"s3://127.0.0.1:{moto.port}/{bucket}/{prefix}"


def clients(server):
    return [connect("http", server), connect("grpc", server)]


def cache_of(mount: Path) -> Path:
    caches = list(mount.iterdir())
    assert len(caches) == 1, caches
    return caches[0] / "models"


def start_failure(args: list[str], env: dict) -> tuple[int, list[str]]:
    """Run the server expecting it to stop at start-up: (exit status, error lines)."""
    command = [sys.executable, "-m", "mini_triton", "--http-port=0", "--grpc-port=0",
               "--metrics-port=0", *args]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                            cwd=ROOT)
    lines = (result.stdout + result.stderr).splitlines()
    return result.returncode, [line for line in lines if " E " in line or "ERROR" in line
                               or line.startswith("E")]


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def stop_emulator(proc: subprocess.Popen, log) -> None:
    """End an emulator a module's tests started, and close its log."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()

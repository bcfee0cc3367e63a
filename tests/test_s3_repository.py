"""s3:// model repositories against a real S3-compatible server (moto's standalone
server on a free local port, with IAM authentication on), driven by boto3 and by the
real mini_triton server with stock tritonclient over HTTP and gRPC.

Outside CI a missing moto or boto3 skips these tests with the way to install them;
in CI (CI=true) it fails them instead, so a broken install can never pass as a skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from tritonclient.utils import InferenceServerException

from conftest import ROOT, connect, free_port
from mini_triton.core.names import printable
from serverproc import ServerProcess
from test_lifecycle import IDENTITY, echo, index, wait_until

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


# --- none mode ---


def test_none_mode_serves_from_the_bucket_and_removes_its_cache(moto, s3, bucket, mount):
    put_model(s3, bucket, "repo", "simple")
    put_model(s3, bucket, "repo", "marked", versions=(1, 3), marker=True)
    s3.put_object(Bucket=bucket, Key="repo/README.txt", Body=b"not a model folder")
    url = repository_url(moto, bucket)
    with ServerProcess([f"--model-repository={url}"], env=server_env(moto, mount)) as server:
        for protocol in clients(server):
            assert protocol.client.is_server_ready()
            assert echo(protocol, "simple") == "1"
            assert echo(protocol, "marked") == "3"
            names = {entry["name"] for entry in index(protocol)}
            assert names == {"simple", "marked"}
            protocol.client.close()
        cache = cache_of(mount)
        assert (cache / "simple" / "config.pbtxt").is_file()
        assert (cache / "simple" / "1" / "weights").read_bytes() == b"\x00" * 16
        assert (cache / "marked" / "3").is_dir()
        assert not (cache / "README.txt").exists()
        assert f"model repository {url} is mirrored in {cache}" in server.output
        assert server.stop() == 0
    assert list(mount.iterdir()) == []  # the folder it made is gone, the mount stays


def test_cache_in_the_system_temporary_folder_without_a_mount(moto, s3, bucket, tmp_path):
    put_model(s3, bucket, "repo", "simple")
    env = server_env(moto)
    env["TMPDIR"] = str(tmp_path)
    with ServerProcess([f"--model-repository={repository_url(moto, bucket)}"],
                       env=env) as server:
        protocol = connect("grpc", server)
        assert echo(protocol, "simple") == "1"
        protocol.client.close()
        made = [p for p in tmp_path.iterdir() if p.name.startswith("mini_triton_repository_")]
        assert len(made) == 1 and (made[0] / "models" / "simple" / "config.pbtxt").is_file()
        server.stop()
    assert not made[0].exists()


def test_bucket_root_and_a_local_folder_together(moto, s3, bucket, tmp_path):
    s3.put_object(Bucket=bucket, Key="cloud/config.pbtxt",
                  Body=IDENTITY.format(name="cloud", extra="").encode())
    s3.put_object(Bucket=bucket, Key="cloud/1/w", Body=b"1")
    local = tmp_path / "local"
    (local / "here" / "2").mkdir(parents=True)
    (local / "here" / "config.pbtxt").write_text(IDENTITY.format(name="here", extra=""))
    args = [f"--model-repository=s3://127.0.0.1:{moto.port}/{bucket}",
            f"--model-repository={local}"]
    with ServerProcess(args, env=server_env(moto)) as server:
        protocol = connect("http", server)
        assert echo(protocol, "cloud") == "1"
        assert echo(protocol, "here") == "2"
        protocol.client.close()


# --- poll mode ---


def test_poll_mode_follows_the_bucket(moto, s3, bucket, mount):
    put_model(s3, bucket, "repo", "changing")
    put_model(s3, bucket, "repo", "steady")
    args = [f"--model-repository={repository_url(moto, bucket)}", "--model-control-mode=poll",
            "--repository-poll-secs=1"]
    with ServerProcess(args, env=server_env(moto, mount)) as server:
        http, grpc = clients(server)
        assert echo(http, "changing") == "1" and echo(grpc, "steady") == "1"
        cache = cache_of(mount)
        steady_config = (cache / "steady" / "config.pbtxt").stat()

        # a new version uploaded is loaded by the next poll (latest policy: 2 replaces 1)
        s3.put_object(Bucket=bucket, Key="repo/changing/2/weights", Body=b"v2")
        wait_until(lambda: echo(http, "changing") == "2", what="version 2 served")
        assert echo(grpc, "changing") == "2"

        # a new model appears
        put_model(s3, bucket, "repo", "fresh")
        wait_until(lambda: grpc.client.is_model_ready("fresh"), what="new model loaded")
        assert echo(http, "fresh") == "1"

        # a deleted version folder and a deleted model are unloaded
        delete_prefix(s3, bucket, "repo/changing/2/")
        wait_until(lambda: echo(grpc, "changing") == "1", what="back to version 1")
        assert not (cache / "changing" / "2").exists()
        delete_prefix(s3, bucket, "repo/changing/")
        wait_until(lambda: not http.client.is_model_ready("changing"), what="model unloaded")
        assert not (cache / "changing").exists()
        entry = next(e for e in index(http) if e["name"] == "changing")
        assert entry["state"] == "UNAVAILABLE"

        # what did not change was never downloaded again
        again = (cache / "steady" / "config.pbtxt").stat()
        assert (again.st_ino, again.st_mtime_ns) == (steady_config.st_ino,
                                                      steady_config.st_mtime_ns)
        assert echo(http, "steady") == "1"
        for protocol in (http, grpc):
            protocol.client.close()


def test_poll_keeps_serving_through_refused_credentials(moto, s3, bucket, mount):
    """Access to the bucket is taken away from the server's user, then given back: the
    failing polls are logged in one line each and change nothing."""
    put_model(s3, bucket, "repo", "kept")
    iam = moto.client("iam")
    args = [f"--model-repository={repository_url(moto, bucket)}", "--model-control-mode=poll",
            "--repository-poll-secs=1"]
    with ServerProcess(args, env=server_env(moto, mount)) as server:
        http = connect("http", server)
        assert echo(http, "kept") == "1"
        iam.delete_user_policy(UserName="server", PolicyName="all")
        try:
            delete_prefix(s3, bucket, "repo/kept/")  # would unload it, were it seen
            wait_until(lambda: "repository poll failed" in server.output,
                       what="a failed poll logged")
            assert echo(http, "kept") == "1"
            assert http.client.is_model_ready("kept")
        finally:
            iam.put_user_policy(UserName="server", PolicyName="all", PolicyDocument=ALLOW_ALL)
        wait_until(lambda: not http.client.is_model_ready("kept"), what="the deletion seen")
        line = next(l for l in server.lines if "repository poll failed" in l)
        assert "access denied" in line and "AccessDenied" in line
        assert "Traceback" not in server.output
        http.client.close()


# --- explicit mode ---


def test_explicit_mode_loads_and_unloads_from_the_bucket(moto, s3, bucket, mount):
    put_model(s3, bucket, "repo", "first")
    put_model(s3, bucket, "repo", "second")
    args = [f"--model-repository={repository_url(moto, bucket)}",
            "--model-control-mode=explicit", "--load-model=first"]
    with ServerProcess(args, env=server_env(moto, mount)) as server:
        http, grpc = clients(server)
        assert http.client.is_model_ready("first")
        assert not grpc.client.is_model_ready("second")
        assert {e["name"] for e in index(grpc)} == {"first", "second"}
        cache = cache_of(mount)
        assert not (cache / "second").exists()  # only what is loaded is downloaded

        http.client.load_model("second")
        assert echo(grpc, "second") == "1"
        put_model(s3, bucket, "repo", "later")  # uploaded after start-up
        grpc.client.load_model("later")
        assert echo(http, "later") == "1"

        s3.put_object(Bucket=bucket, Key="repo/first/4/weights", Body=b"v4")
        assert echo(http, "first") == "1"  # explicit mode: nothing changes by itself
        grpc.client.load_model("first")
        assert echo(grpc, "first") == "4"

        http.client.unload_model("second")
        assert not grpc.client.is_model_ready("second")
        with pytest.raises(InferenceServerException) as caught:
            grpc.client.load_model("absent")
        assert "'absent' is not found in any model repository" in caught.value.message()
        for protocol in (http, grpc):
            protocol.client.close()


# --- start-up errors ---


def test_missing_bucket_stops_the_server_in_one_line(moto):
    url = repository_url(moto, "no-such-bucket")
    status, errors = start_failure([f"--model-repository={url}"], server_env(moto))
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "bucket 'no-such-bucket' does not exist" in errors[0]
    assert "NoSuchBucket" in errors[0]


@pytest.mark.parametrize("which", ["secret", "key_id"])
def test_bad_credentials_stop_the_server_in_one_line(moto, s3, bucket, which):
    put_model(s3, bucket, "repo", "simple")
    url = repository_url(moto, bucket)
    env = server_env(moto, **({"secret": "wrong-secret"} if which == "secret"
                              else {"key_id": "AKIANOTAKEY000000000"}))
    status, errors = start_failure([f"--model-repository={url}"], env)
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "access denied, check the credentials" in errors[0]
    code = "SignatureDoesNotMatch" if which == "secret" else "InvalidAccessKeyId"
    assert code in errors[0]
    assert "wrong-secret" not in errors[0]


def test_unreachable_endpoint_stops_the_server_in_one_line(moto):
    url = f"s3://127.0.0.1:{free_port()}/some-bucket/repo"
    status, errors = start_failure([f"--model-repository={url}"], server_env(moto))
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "not reachable" in errors[0]


def test_empty_prefix_stops_the_server_as_a_missing_folder(moto, bucket):
    url = repository_url(moto, bucket, "typo")
    status, errors = start_failure([f"--model-repository={url}"], server_env(moto))
    assert status == 1
    assert len(errors) == 1 and url in errors[0] and "no object under 'typo/'" in errors[0]


def test_a_mount_directory_that_is_not_a_folder(moto, bucket, tmp_path):
    env = server_env(moto, tmp_path / "absent")
    status, errors = start_failure([f"--model-repository={repository_url(moto, bucket, '')}"],
                                   env)
    assert status == 1
    assert len(errors) == 1 and "TRITON_AWS_MOUNT_DIRECTORY" in errors[0]


@pytest.mark.parametrize("url, module, extra", [
    ("s3://some-bucket/repo", "boto3", "s3"),
    ("gs://some-bucket/repo", "google.cloud.storage", "gs"),
    ("as://account/container/repo", "azure.storage.blob", "azure"),
])
def test_a_missing_client_names_the_extra_to_install(url, module, extra):
    """The client library made unimportable (sys.modules[name] = None) in the server's
    own process."""
    code = ("import sys\n"
            f"sys.modules[{module!r}] = None\n"
            "from mini_triton.cli import main\n"
            f"sys.exit(main(['--model-repository={url}', '--http-port=0', '--grpc-port=0', "
            "'--metrics-port=0']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    assert f"pip install 'mini-triton[{extra}]'" in result.stderr


# --- object keys that try to leave the cache ---


EVIL_KEYS = [
    "repo/../../escaped-1",          # model folder '..'
    "repo/../escaped-2/config.pbtxt",
    "repo/./escaped-3",
    "repo/good/../../../escaped-4",  # '..' inside a model folder
    "repo/good/1/../../../../escaped-5",
    "repo/good//escaped-6",          # an empty segment
    "repo//escaped-7",               # an empty model name
    "repo/good/1/a\\..\\..\\escaped-8",
    "repo/.hidden/escaped-9",
]


def test_object_keys_cannot_write_outside_the_cache(moto, s3, bucket, tmp_path):
    mount = tmp_path / "deep" / "mount"
    mount.mkdir(parents=True)
    put_model(s3, bucket, "repo", "good")
    for key in EVIL_KEYS:
        s3.put_object(Bucket=bucket, Key=key, Body=b"escaped")
    before = {p for p in tmp_path.rglob("*")}
    with ServerProcess([f"--model-repository={repository_url(moto, bucket)}",
                        "--model-control-mode=poll", "--repository-poll-secs=1"],
                       env=server_env(moto, mount)) as server:
        protocol = connect("http", server)
        assert echo(protocol, "good") == "1"
        cache = cache_of(mount)
        made = {p.relative_to(cache) for p in cache.rglob("*")}
        assert made == {Path("good"), Path("good/config.pbtxt"), Path("good/1"),
                        Path("good/1/weights")}
        outside = {p for p in tmp_path.rglob("*") if cache not in (p, *p.parents)} - before
        assert outside == {cache.parent, cache.parent / "partial"}
        assert list((cache.parent / "partial").iterdir()) == []
        assert not [p for p in tmp_path.rglob("escaped-*")]
        assert {e["name"] for e in index(protocol)} == {"good"}
        protocol.client.close()
    # the messages of the log lines (Triton's format quotes them as JSON strings)
    messages = [json.loads(line.split("] ", 1)[1]) for line in server.lines
                if '] "' in line]
    warned = [m for m in messages if "skipping object" in m]
    for key in EVIL_KEYS[:-1]:  # a hidden folder is skipped quietly, as a local one
        assert any(f"skipping object '{printable(key)}'" in line for line in warned), key
    assert len(warned) == len(EVIL_KEYS) - 1  # once each, not at every poll


# --- the mirror itself, without a server ---


def test_mirror_downloads_only_what_changed_and_deletes_what_is_gone(moto, s3, bucket, mount,
                                                                     monkeypatch):
    from mini_triton.repository.storage import ALL, open_repository

    for name, value in server_env(moto, mount).items():
        monkeypatch.setenv(name, value)
    put_model(s3, bucket, "repo", "m", versions=(1, 2))
    s3.put_object(Bucket=bucket, Key="repo/m/labels.txt", Body=b"a\nb\n")
    repository = open_repository(repository_url(moto, bucket))
    repository.check()
    try:
        folders = repository.model_dirs(ALL)
        model = folders["m"]
        assert sorted(str(p.relative_to(model)) for p in model.rglob("*")) == [
            "1", "1/weights", "2", "2/weights", "config.pbtxt", "labels.txt"]
        stamp = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in model.rglob("*")
                 if p.is_file()}

        repository.model_dirs(ALL)  # nothing changed: nothing written
        assert stamp == {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stamp}

        s3.put_object(Bucket=bucket, Key="repo/m/labels.txt", Body=b"a\nb\nc\n")
        s3.delete_object(Bucket=bucket, Key="repo/m/2/weights")
        s3.put_object(Bucket=bucket, Key="repo/m/1", Body=b"a file where a folder is")
        repository.model_dirs(ALL)
        assert (model / "labels.txt").read_bytes() == b"a\nb\nc\n"
        assert not (model / "2").exists()
        assert (model / "1" / "weights").is_file()  # the folder wins over the file '1'
        config = model / "config.pbtxt"
        assert (config.stat().st_ino, config.stat().st_mtime_ns) == stamp[config]

        # a local file that is not in the bucket, or a changed local copy, is corrected
        (model / "stray").write_bytes(b"x")
        (model / "labels.txt").write_bytes(b"tampered")
        repository.model_dirs({"m"})
        assert not (model / "stray").exists()
        assert (model / "labels.txt").read_bytes() == b"a\nb\nc\n"

        assert repository.model_dirs() == {"m": model}  # the last listing, no network
        delete_prefix(s3, bucket, "repo/m/")
        assert repository.model_dirs(ALL) == {}
        assert not model.exists()
    finally:
        repository.close()
    assert list(mount.iterdir()) == []


def test_mirror_refuses_a_link_planted_in_the_cache(moto, s3, bucket, mount, tmp_path,
                                                    monkeypatch):
    """Even a link someone with access to the cache put there is not followed."""
    from mini_triton.repository.storage import ALL, open_repository

    for name, value in server_env(moto, mount).items():
        monkeypatch.setenv(name, value)
    put_model(s3, bucket, "repo", "m")
    victim = tmp_path / "victim"
    victim.mkdir()
    repository = open_repository(repository_url(moto, bucket))
    try:
        model = repository.model_dirs(ALL)["m"]
        (model / "1" / "weights").unlink()
        (model / "1").rmdir()
        (model / "1").symlink_to(victim, target_is_directory=True)
        s3.put_object(Bucket=bucket, Key="repo/m/1/weights", Body=b"new")
        repository.model_dirs(ALL)
        assert list(victim.iterdir()) == []
        assert not (model / "1").is_symlink()
        assert (model / "1" / "weights").read_bytes() == b"new"
    finally:
        repository.close()


# --- URLs ---


@pytest.mark.parametrize("url, expected", [
    ("s3://bucket", ("bucket", "", None)),
    ("s3://bucket/path/to/repo", ("bucket", "path/to/repo", None)),
    ("s3://bucket//path///repo/", ("bucket", "path/repo", None)),
    ("s3://127.0.0.1:9000/bucket/repo", ("bucket", "repo", "http://127.0.0.1:9000")),
    ("s3://minio.local:9000/bucket", ("bucket", "", "http://minio.local:9000")),
    ("s3://http://host:80/bucket/repo", ("bucket", "repo", "http://host:80")),
    ("s3://https://host:443/bucket/repo", ("bucket", "repo", "https://host:443")),
])
def test_s3_url_forms(url, expected):
    from mini_triton.repository.storage import parse_s3_url

    assert parse_s3_url(url) == expected


@pytest.mark.parametrize("url, fragment", [
    ("s3://", "no bucket name"),
    ("s3://host:9000/", "no bucket name"),
    ("s3://https://bucket/repo", "must be followed by host:port/bucket"),
    ("s3://bu$ket/repo", "not a valid bucket name"),
    ("as://account", "as://account/container/path is expected"),
    ("ftp://host/repo", "a local folder, s3://, gs:// or as:// is expected"),
])
def test_bad_urls(url, fragment):
    from mini_triton.repository.storage import StorageError, open_repository

    try:
        open_repository(url)
    except StorageError as error:
        assert fragment in str(error)
    else:
        pytest.fail(f"{url} accepted")


# --- gs:// against a local Cloud Storage emulator (gcp-storage-emulator) ---
#
# The emulator keeps no credentials, so refused credentials are untested for gs://;
# a missing bucket, the three modes and the mirror are tested.


def require_gcs_tools() -> None:
    """Skip (outside CI) or fail (CI=true) when the client or the emulator is missing."""
    missing = [name for name in ("google.cloud.storage", "gcp_storage_emulator")
               if _spec(name) is None]
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must install them (pip install -e '.[test]')",
                    pytrace=False)
    pytest.skip(f"{reason} (install with pip install -e '.[test]')")


def _spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


@pytest.fixture(scope="module")
def gcs_emulator(tmp_path_factory):
    require_gcs_tools()
    port = free_port()
    tmp = tmp_path_factory.mktemp("gcs")
    log = open(tmp / "gcs.log", "w")
    command = [sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()",
               "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError("gcs emulator exited:\n" + (tmp / "gcs.log").read_text())
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                break
        except urllib.error.HTTPError:
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError("gcs emulator did not start") from None
            time.sleep(0.05)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def gcs_env(emulator: str, mount: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "TRITON_GCS_", "STORAGE_EMULATOR_"))}
    env["STORAGE_EMULATOR_HOST"] = emulator
    if mount is not None:
        env["TRITON_GCS_MOUNT_DIRECTORY"] = str(mount)
    return env


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    from google.cloud import storage

    client = storage.Client()
    return client.create_bucket(f"models-{uuid.uuid4().hex[:12]}")


def gcs_put_model(bucket, name: str, versions=(1,)) -> None:
    bucket.blob(f"repo/{name}/config.pbtxt").upload_from_string(
        IDENTITY.format(name=name, extra=""))
    for version in versions:
        bucket.blob(f"repo/{name}/{version}/weights").upload_from_string(b"\x00" * 16)


def test_gs_poll_mode_follows_the_bucket(gcs_emulator, gcs_bucket, mount):
    gcs_put_model(gcs_bucket, "g")
    args = [f"--model-repository=gs://{gcs_bucket.name}/repo", "--model-control-mode=poll",
            "--repository-poll-secs=1"]
    with ServerProcess(args, env=gcs_env(gcs_emulator, mount)) as server:
        http, grpc = clients(server)
        assert echo(http, "g") == "1" and echo(grpc, "g") == "1"
        assert (cache_of(mount) / "g" / "1" / "weights").is_file()
        gcs_bucket.blob("repo/g/2/weights").upload_from_string(b"v2")
        wait_until(lambda: echo(grpc, "g") == "2", what="version 2 served")
        for blob in list(gcs_bucket.list_blobs(prefix="repo/g/")):
            blob.delete()
        wait_until(lambda: not http.client.is_model_ready("g"), what="model unloaded")
        for protocol in (http, grpc):
            protocol.client.close()
        server.stop()
    assert list(mount.iterdir()) == []


def test_gs_explicit_mode(gcs_emulator, gcs_bucket, mount):
    gcs_put_model(gcs_bucket, "one")
    gcs_put_model(gcs_bucket, "two")
    args = [f"--model-repository=gs://{gcs_bucket.name}/repo", "--model-control-mode=explicit"]
    with ServerProcess(args, env=gcs_env(gcs_emulator, mount)) as server:
        http, grpc = clients(server)
        assert {e["name"] for e in index(http)} == {"one", "two"}
        grpc.client.load_model("two")
        assert echo(http, "two") == "1"
        http.client.unload_model("two")
        assert not grpc.client.is_model_ready("two")
        assert not grpc.client.is_model_ready("one")
        for protocol in (http, grpc):
            protocol.client.close()


def test_gs_missing_bucket_stops_the_server_in_one_line(gcs_emulator):
    url = "gs://no-such-bucket-here/repo"
    status, errors = start_failure([f"--model-repository={url}"], gcs_env(gcs_emulator))
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "bucket 'no-such-bucket-here' does not exist" in errors[0]


def test_gs_unreachable_endpoint_stops_the_server_in_one_line(gcs_emulator):
    url = "gs://some-bucket/repo"
    env = gcs_env(f"http://127.0.0.1:{free_port()}")
    status, errors = start_failure([f"--model-repository={url}"], env)
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "not reachable" in errors[0]


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
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


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

"""s3:// model repositories against a real S3-compatible server (moto's standalone
server on a free local port, with IAM authentication on), driven by boto3 and by the
real mini_triton server with stock tritonclient over HTTP and gRPC: the three
model control modes (none, poll, explicit) served from a bucket.
"""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from cloud_repositories import (ALLOW_ALL, cache_of, clients, delete_prefix, put_model,
                                repository_url, server_env)
from cloud_repositories import bucket, moto, mount, s3  # noqa: F401 (fixtures)
from conftest import connect
from serverproc import ServerProcess
from test_lifecycle import IDENTITY, echo, index, wait_until


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

"""s3:// model repositories against a real S3-compatible server (moto's standalone
server on a free local port, with IAM authentication on), driven by boto3 and by the
real mini_triton server with stock tritonclient over HTTP and gRPC: start-up
errors (a missing bucket, bad credentials, an unreachable endpoint, a missing client)
stop the server in one line, and bad URLs are refused.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from cloud_repositories import put_model, repository_url, server_env, start_failure
from cloud_repositories import bucket, moto, s3  # noqa: F401 (fixtures)
from conftest import ROOT, free_port


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

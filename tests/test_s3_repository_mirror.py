"""s3:// model repositories against a real S3-compatible server (moto's standalone
server on a free local port, with IAM authentication on), driven by boto3 and by the
real mini_triton server with stock tritonclient over HTTP and gRPC: the mirror
in the local cache: object keys cannot write outside it, only what changed is downloaded,
what is gone is deleted, and a link planted in the cache is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from cloud_repositories import cache_of, delete_prefix, put_model, repository_url, server_env
from cloud_repositories import bucket, moto, mount, s3  # noqa: F401 (fixtures)
from conftest import connect
from mini_triton.core.names import printable
from serverproc import ServerProcess
from test_lifecycle import echo, index


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

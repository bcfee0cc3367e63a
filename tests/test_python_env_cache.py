"""The cache of unpacked execution-environment archives: a model update (a new version
of the archive) unpacks anew, and the old copy is deleted once nothing runs from it,
never while a loaded model or a running worker still does; the server deletes only
folders it made, and never follows a link.

The archives are venvs packed here, offline (test_python_exec_env's builders).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from serverproc import ServerProcess
from test_python_exec_env import _client, add_model, infer, make_venv, pack
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from mini_triton.backends.python import env_cache, exec_env, worker_process

PROTOCOLS = ["http", "grpc"]
PRECIOUS = "not the cache's to delete\n"
REMOVAL_TIMEOUT_S = 60.0


def bump_mtime(archive: Path) -> None:
    """What a model update does to the archive: a new modification time."""
    info = archive.stat()
    os.utime(archive, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))


def wait_gone(path: Path) -> bool:
    deadline = time.monotonic() + REMOVAL_TIMEOUT_S
    while os.path.lexists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Setup:
    def __init__(self, root: Path):
        self.root = root
        self.repository = root / "models"
        self.cache = root / "cache"
        self.cache.mkdir(mode=0o700)
        self.victim = root / "victim"  # outside the cache: links point here
        self.victim.mkdir()
        (self.victim / "precious.txt").write_text(PRECIOUS)
        self.foreign: list[Path] = []  # planted in the cache, none of the server's making

    def archive(self, protocol: str) -> Path:
        return self.root / "envs" / f"{protocol} env.tar.gz"

    def plant_foreign_entries(self, archive: Path) -> None:
        """Entries named as the cache names copies of `archive`, none made by a server."""
        key = env_cache._cache_key
        no_marker = self.cache / key(str(archive), 1, 1)  # the naming, no marker
        no_marker.mkdir()
        (no_marker / "precious.txt").write_text(PRECIOUS)
        wrong_marker = self.cache / key(str(archive), 3, 3)  # a marker for another name
        wrong_marker.mkdir()
        (wrong_marker / env_cache._COMPLETE).write_text(
            f'{{"archive": "{archive}", "mtime_ns": 4, "size": 4}}')
        # A link named as a copy, to a folder whose marker matches that name exactly.
        link = self.cache / key(str(archive), 2, 2)
        target = self.root / f"linked {archive.stem}"
        target.mkdir()
        (target / env_cache._COMPLETE).write_text(
            f'{{"archive": "{archive}", "mtime_ns": 2, "size": 2}}')
        (target / "precious.txt").write_text(PRECIOUS)
        link.symlink_to(target)
        self.foreign += [no_marker, wrong_marker, link]

    def assert_foreign_entries_intact(self) -> None:
        for entry in self.foreign:
            assert os.path.lexists(entry), entry
        for entry in self.foreign:
            if entry.is_symlink():
                assert (entry / "precious.txt").read_text() == PRECIOUS
        assert (self.victim / "precious.txt").read_text() == PRECIOUS


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    s = Setup(tmp_path_factory.mktemp("env_cache"))
    venv = make_venv(s.root / "to_pack", copies=True)
    (s.root / "envs").mkdir()
    for protocol in PROTOCOLS:
        archive = pack(venv, s.archive(protocol))
        for model in ("first", "second"):
            add_model(s.repository, f"{model}_{protocol}", str(archive))
        s.plant_foreign_entries(archive)
    # An archive whose copy's exact folder is taken by something the server did not make.
    tiny = s.root / "tiny"
    (tiny / "bin").mkdir(parents=True)
    (tiny / "bin" / "activate").write_text("# never unpacked\n")
    blocked = pack(tiny, s.root / "envs" / "blocked.tar.gz")
    in_the_way = s.cache / env_cache.current_key(blocked)
    in_the_way.mkdir()
    (in_the_way / "precious.txt").write_text(PRECIOUS)
    add_model(s.repository, "blocked", str(blocked))
    s.foreign.append(in_the_way)
    return s


@pytest.fixture(scope="module")
def server(setup):
    env = dict(os.environ, **{env_cache.CACHE_ENVIRONMENT: str(setup.cache)})
    args = ["--model-repository", str(setup.repository), "--model-control-mode=explicit",
            *(f"--load-model={model}_{protocol}" for protocol in PROTOCOLS
              for model in ("first", "second"))]
    with ServerProcess(args, env=env, ready_timeout=240) as running:
        yield running


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_old_copy_is_removed_once_no_loaded_model_uses_it(setup, server, protocol):
    first, second = f"first_{protocol}", f"second_{protocol}"
    _, client = _client(protocol, server)
    old = Path(infer(protocol, server, first)[1])
    assert old.parent == setup.cache and Path(infer(protocol, server, second)[1]) == old
    (old / "escape").symlink_to(setup.victim)  # deleting the copy must not follow it

    bump_mtime(setup.archive(protocol))
    client.load_model(first)  # the update: `first` reloads from a new copy
    new = Path(infer(protocol, server, first)[1])
    assert new != old and new.parent == setup.cache
    assert old.is_dir()  # `second` still runs from the old copy: kept
    assert Path(infer(protocol, server, second)[1]) == old

    client.unload_model(second)  # nothing uses the old copy any more
    assert wait_gone(old), f"{old} was not removed"
    assert not os.path.lexists(f"{old}.lock")
    assert new.is_dir() and infer(protocol, server, first)[0] == [3.0, 6.0, 9.0]
    client.unload_model(first)
    client.load_model(first)  # the current version's copy stays for the next load
    assert Path(infer(protocol, server, first)[1]) == new
    setup.assert_foreign_entries_intact()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_folder_in_the_way_is_a_load_error_and_is_kept(setup, server, protocol):
    _, client = _client(protocol, server)
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("blocked")
    in_the_way = setup.foreign[-1]
    assert f"'{in_the_way}' is in the way and was not made by this server" in str(raised.value)
    assert (in_the_way / "precious.txt").read_text() == PRECIOUS
    setup.assert_foreign_entries_intact()


def test_a_running_worker_keeps_its_copy_until_it_ends(setup, tmp_path, monkeypatch):
    """The server has let go of the copy (its model unloaded); a worker started from it
    still runs (stuck past the unload timeout, say): the copy stays until it ends."""
    monkeypatch.setenv(env_cache.CACHE_ENVIRONMENT, str(tmp_path / "cache"))
    archive = tmp_path / "env.tar.gz"
    shutil.copyfile(setup.archive("http"), archive)
    config = mc.ModelConfig(name="held")
    config.parameters[exec_env.EXECUTION_ENV_PATH].string_value = str(archive)
    environment = exec_env.from_config(config, tmp_path)
    old = environment.root
    process, link = worker_process.spawn("held_0", environment)
    try:
        exec_env.release(environment)  # the server's hold is gone; the worker's is not
        bump_mtime(archive)
        newer = exec_env.from_config(config, tmp_path)  # unpacks anew, prunes what is free
        assert newer.root != old
        assert old.is_dir()  # the worker still runs from it
        assert process.poll() is None
    finally:
        worker_process.stop_process(process, link)
    exec_env.release(newer)  # the next prune finds the old copy free
    assert not os.path.lexists(old)
    assert newer.root.is_dir()  # the archive as it is now: kept for the next load


def test_loads_racing_to_unpack_one_archive_all_get_the_copy(setup, tmp_path, monkeypatch):
    """Loads that all found the copy missing: one unpacks it and then holds it shared
    for its model's life; the others must take the copy as it is, never wait to unpack
    it again behind that hold."""
    monkeypatch.setenv(env_cache.CACHE_ENVIRONMENT, str(tmp_path / "cache"))
    monkeypatch.setattr(env_cache, "LOCK_TIMEOUT_S", 60.0)
    archive = tmp_path / "env.tar.gz"
    shutil.copyfile(setup.archive("http"), archive)
    lock_file = env_cache.cache_root() / f"{env_cache.current_key(archive)}.lock"
    # Another load holds the lock shared, having found the copy missing: every load
    # here finds it missing too and must wait for the exclusive lock to unpack it.
    holder = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_SH)
    refused_exclusive = threading.Semaphore(0)
    try_lock = env_cache._try_lock

    def watched_try_lock(path, operation):  # the real lock, and a note when it is busy
        fd = try_lock(path, operation)
        if fd is None and operation == fcntl.LOCK_EX:
            refused_exclusive.release()
        return fd

    monkeypatch.setattr(env_cache, "_try_lock", watched_try_lock)
    leases, errors = [], []

    def load():
        try:
            leases.append(env_cache.acquire(archive))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    loads = [threading.Thread(target=load) for _ in range(3)]
    for thread in loads:
        thread.start()
    try:
        for _ in loads:  # each is waiting to unpack
            assert refused_exclusive.acquire(timeout=60)
    finally:
        os.close(holder)
    for thread in loads:
        thread.join(90)
    assert not errors and len(leases) == 3
    assert {lease.copy for lease in leases} == {env_cache.cache_root() /
                                                env_cache.current_key(archive)}
    for lease in leases:
        lease.release()

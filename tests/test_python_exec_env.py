"""Python execution environments (python_backend's EXECUTION_ENV_PATH): a model runs
in its own Python environment, a folder or a conda-pack-style archive, and a broken
or incompatible environment is a load error naming the path and what is wrong.

The environments are venvs made here, offline: numpy comes from the server's own
environment (linked or copied in) and a tiny package the server lacks is written
into their site-packages.
"""

from __future__ import annotations

import glob
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from serverproc import ServerProcess
from tritonclient.utils import InferenceServerException

from mini_triton.backends.python import env_cache, exec_env

ENV_ONLY_PACKAGE = "mt_env_only_pkg"
PLACEHOLDER_PREFIX = "/opt/conda-pack-placeholder-prefix"

MODEL = f'''
import importlib.util
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

import {ENV_ONLY_PACKAGE}

# Server-side packages the worker must not see inside an environment.
LEAKED = [n for n in ("grpc", "tritonclient", "httptools") if importlib.util.find_spec(n)]


def _prefix_file():
    path = os.path.join(sys.prefix, "etc", "prefix.txt")
    return open(path).read().strip() if os.path.exists(path) else ""


class TritonPythonModel:
    def execute(self, requests):
        info = np.array([sys.prefix.encode(), {ENV_ONLY_PACKAGE}.__file__.encode(),
                         ",".join(LEAKED).encode(), _prefix_file().encode()], dtype=object)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUTPUT0", {ENV_ONLY_PACKAGE}.scale(
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())),
            pb_utils.Tensor("INFO", info)]) for r in requests]
'''

# The same model, its inputs and outputs given by its auto_complete_config (which
# must run in the environment too: model.py imports the env-only package).
AUTO_COMPLETE = MODEL + '''
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [4]})
        return config
'''

CONFIG = '''name: "{name}"
backend: "python"
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }},
         {{ name: "INFO", data_type: TYPE_STRING, dims: [ 4 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
{extra}'''

# What conda-pack's bin/conda-unpack does, in miniature: replace the placeholder
# prefix left in the environment's files by the folder it now lives in (computed
# from where the script is), and note that it ran.
CONDA_UNPACK = f'''import os
prefix = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
path = os.path.join(prefix, "etc", "prefix.txt")
text = open(path).read()
open(path, "w").write(text.replace({PLACEHOLDER_PREFIX!r}, prefix))
with open(os.path.join(prefix, "etc", "conda-unpack-runs.txt"), "a") as log:
    log.write(prefix + "\\n")
'''


# --- building environments ---

def _link_or_copy(source, destination):
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def make_venv(folder: Path, python: str = sys.executable, numpy_too: bool = True,
              copies: bool = False) -> Path:
    """A venv at `folder` (no pip: nothing is downloaded) holding the env-only package,
    and numpy from the server's environment unless `numpy_too` is false."""
    command = [python, "-m", "venv", "--without-pip", *(["--copies"] if copies else []),
               str(folder)]
    subprocess.run(command, check=True, capture_output=True)
    site = Path(glob.glob(str(folder / "lib" / "python*" / "site-packages"))[0])
    package = site / ENV_ONLY_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("def scale(array):\n    return array * 3\n")
    if numpy_too:
        numpy_dir = Path(np.__file__).parent
        for name in ("numpy", "numpy.libs"):
            source = numpy_dir.parent / name
            if source.is_dir():
                shutil.copytree(source, site / name, copy_function=_link_or_copy,
                                ignore=shutil.ignore_patterns("tests", "__pycache__"))
    return folder


def pack(folder: Path, archive: Path, extra: dict[str, str] | None = None) -> Path:
    """A conda-pack-style archive of `folder`: its contents at the archive's root."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for entry in sorted(folder.iterdir()):
            tar.add(entry, arcname=entry.name)
        for name, text in (extra or {}).items():
            _add_text(tar, name, text, 0o755)
    return archive


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    member = tarfile.TarInfo(name)
    member.size, member.mode = len(data), mode
    tar.addfile(member, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = tarfile.SYMTYPE, target
    tar.addfile(member)


def other_python() -> str | None:
    """An interpreter of another major.minor than the server's, if this machine has one."""
    candidates = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3")
                        + glob.glob("/usr/bin/python3.[0-9]*")
                        + glob.glob("/usr/local/bin/python3.[0-9]*"))
    for candidate in candidates:
        if candidate.endswith("-config"):
            continue
        try:
            found = subprocess.run(
                [candidate, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if found.returncode == 0 and found.stdout.split() != [str(v) for v in
                                                              sys.version_info[:2]]:
            return candidate
    return None


def add_model(repository: Path, name: str, env: str, extra: str = "") -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name, env=env, extra=extra))
    return folder


# --- the served repository ---

class Setup:
    def __init__(self, root: Path):
        self.root = root
        self.repository = root / "models"
        self.cache = root / "cache"
        self.outside = root / "outside"  # what hostile archives aim at; stays empty
        self.outside.mkdir()
        self.tarball = root / "envs" / "packed env.tar.gz"
        self.problems: dict[str, tuple[str, ...]] = {}  # model → what its load error says

    def bad(self, name: str, env: str, *says: str, extra: str = "") -> None:
        add_model(self.repository, name, env, extra)
        self.problems[name] = says


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    s = Setup(tmp_path_factory.mktemp("exec_env"))
    # A folder environment inside the model's folder, named through the keyword.
    folder_model = add_model(s.repository, "env_folder", "$$TRITON_MODEL_DIRECTORY/env")
    make_venv(folder_model / "env")
    # An archive (absolute path, a space in its name) used by two models: unpacked once.
    packed = make_venv(s.root / "to_pack", copies=True)
    (packed / "etc").mkdir()
    (packed / "etc" / "prefix.txt").write_text(PLACEHOLDER_PREFIX + "\n")
    s.tarball.parent.mkdir()
    pack(packed, s.tarball, {"bin/conda-unpack": CONDA_UNPACK})
    add_model(s.repository, "env_archive", str(s.tarball))
    add_model(s.repository, "env_archive_too", str(s.tarball))
    auto = s.repository / "env_auto_complete"
    (auto / "1").mkdir(parents=True)
    (auto / "1" / "model.py").write_text(AUTO_COMPLETE)
    (auto / "config.pbtxt").write_text(
        'backend: "python"\n'
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
        '"$$TRITON_MODEL_DIRECTORY/../env_folder/env" } }\n')
    _add_bad_environments(s)
    return s


def _add_bad_environments(s: Setup) -> None:
    bad = s.root / "bad"
    bad.mkdir()
    missing = str(bad / "no_such_env.tar.gz")
    s.bad("bad_missing", missing, f"Failed to get the canonical path for {missing}.")
    no_activate = bad / "no_activate"
    (no_activate / "bin").mkdir(parents=True)
    os.symlink(sys.executable, no_activate / "bin" / "python")
    s.bad("bad_no_activate", str(no_activate), f"Path {no_activate}/bin/activate does not exist",
          "should contain an 'activate' script")
    no_python = bad / "no_python"
    (no_python / "bin").mkdir(parents=True)
    (no_python / "bin" / "activate").write_text("# an environment without an interpreter\n")
    s.bad("bad_no_python", str(no_python), f"Path {no_python}/bin/python does not exist",
          "a Python interpreter")
    no_numpy = make_venv(bad / "no_numpy", numpy_too=False)
    s.bad("bad_no_numpy", str(no_numpy), f"'{no_numpy}'", "cannot import numpy",
          "No module named 'numpy'")
    corrupt = bad / "corrupt.tar.gz"
    corrupt.write_bytes(s.tarball.read_bytes()[:100_000])  # cut short
    s.bad("bad_truncated", str(corrupt), f"'{corrupt}'", "Failed to extract",
          "not a readable tar archive")
    garbage = bad / "garbage.tar.gz"
    garbage.write_bytes(b"this is no archive\n" * 100)
    s.bad("bad_garbage", str(garbage), f"'{garbage}'", "not a readable tar archive")
    _add_hostile_archives(s, bad)
    s.bad("bad_thread_mode", str(s.root / "to_pack"), "'EXECUTION_ENV_PATH'",
          "needs 'execution_mode' 'process'",
          extra='parameters { key: "execution_mode" value: { string_value: "thread" } }\n')


def _add_hostile_archives(s: Setup, bad: Path) -> None:
    """Archives that try to write outside the folder they are unpacked into."""
    # From the folder an archive is unpacked into (cache/<key>/), up and over.
    escape = os.path.join("..", os.path.relpath(s.outside, s.cache))
    hostile = {
        "bad_traversal": lambda tar: _add_text(tar, f"{escape}/planted.txt", "gotcha"),
        "bad_absolute": lambda tar: _add_text(tar, f"{s.outside}/planted.txt", "gotcha"),
        "bad_link_absolute": lambda tar: (_add_link(tar, "lib/escape", str(s.outside)),
                                          _add_text(tar, "lib/escape/planted.txt", "gotcha")),
        "bad_link_relative": lambda tar: (_add_link(tar, "up", escape),
                                          _add_text(tar, "up/planted.txt", "gotcha")),
    }
    for name, add in hostile.items():
        archive = bad / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            _add_text(tar, "bin/activate", "# looks like an environment\n")
            add(tar)
        s.bad(name, str(archive), f"'{archive}'", "unsafe archive member")


@pytest.fixture(scope="module")
def server(setup):
    env = dict(os.environ, **{env_cache.CACHE_ENVIRONMENT: str(setup.cache)})
    args = ["--model-repository", str(setup.repository), "--model-control-mode=explicit",
            "--load-model=env_folder", "--load-model=env_archive",
            "--load-model=env_archive_too", "--load-model=env_auto_complete",
            "--exit-on-error=false"]
    with ServerProcess(args, env=env, ready_timeout=240) as running:
        yield running


def _client(protocol: str, server):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def infer(protocol: str, server, model: str):
    module, client = _client(protocol, server)
    tensor = module.InferInput("INPUT0", [3], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], np.float32))
    result = client.infer(model, [tensor])
    prefix, package, leaked, prefix_file = [v.decode() for v in result.as_numpy("INFO")]
    return result.as_numpy("OUTPUT0").tolist(), prefix, package, leaked, prefix_file


# --- the environment serves ---

def test_the_server_lacks_the_environments_package():
    assert importlib.util.find_spec(ENV_ONLY_PACKAGE) is None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_folder_environment_runs_the_model_with_its_own_packages(setup, server, protocol):
    output, prefix, package, leaked, _ = infer(protocol, server, "env_folder")
    env = setup.repository / "env_folder" / "env"
    assert output == [3.0, 6.0, 9.0]  # computed by the env-only package
    assert Path(prefix) == env  # the environment's interpreter runs the worker
    assert Path(package).is_relative_to(env)
    assert leaked == ""  # the server's own packages are not on the worker's path


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["env_archive", "env_archive_too"])
def test_archive_environment_is_unpacked_once_and_serves(setup, server, protocol, model):
    output, prefix, package, leaked, prefix_file = infer(protocol, server, model)
    assert output == [3.0, 6.0, 9.0]
    assert Path(prefix).parent == setup.cache  # unpacked in the cache
    assert Path(package).is_relative_to(prefix) and leaked == ""
    assert prefix_file == prefix  # conda-unpack ran where the environment is used
    runs = (Path(prefix) / "etc" / "conda-unpack-runs.txt").read_text().splitlines()
    assert runs == [prefix]  # two models, one archive: unpacked and fixed once


def test_archive_reload_reuses_the_unpacked_copy_until_the_file_changes(setup, server):
    _, client = _client("http", server)
    before = infer("http", server, "env_archive")[1]
    client.unload_model("env_archive")
    client.load_model("env_archive")
    assert infer("http", server, "env_archive")[1] == before  # same path, time and size
    stat = setup.tarball.stat()
    os.utime(setup.tarball, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    client.load_model("env_archive")  # a reload: the new version loads beside the old
    after = infer("http", server, "env_archive")[1]
    assert after != before and Path(after).parent == setup.cache
    assert (Path(after) / "etc" / "conda-unpack-runs.txt").read_text().splitlines() == [after]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_auto_complete_config_runs_in_the_environment(setup, server, protocol):
    _, client = _client(protocol, server)
    metadata = client.get_model_metadata("env_auto_complete")
    names = ([t["name"] for t in metadata["outputs"]] if protocol == "http"
             else [t.name for t in metadata.outputs])
    assert names == ["OUTPUT0", "INFO"]
    output, prefix, _, leaked, _ = infer(protocol, server, "env_auto_complete")
    assert output == [3.0, 6.0, 9.0] and leaked == ""
    assert Path(prefix) == setup.repository / "env_folder" / "env"


# --- broken and incompatible environments ---

def _load_error(protocol: str, server, model: str) -> str:
    _, client = _client(protocol, server)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(model)
    assert not client.is_model_ready(model)
    return caught.value.message()


BAD_MODELS = ["bad_missing", "bad_no_activate", "bad_no_python", "bad_no_numpy",
              "bad_truncated", "bad_garbage", "bad_traversal", "bad_absolute",
              "bad_link_absolute", "bad_link_relative", "bad_thread_mode"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", BAD_MODELS)
def test_bad_environment_is_a_load_error_naming_path_and_problem(setup, server, protocol,
                                                                 model):
    message = _load_error(protocol, server, model)
    for part in setup.problems[model]:
        assert part in message, message
    assert list(setup.outside.iterdir()) == []  # nothing was written outside the cache
    leftovers = [p for p in glob.glob(str(setup.cache / "bad_*")) if os.path.isdir(p)]
    assert leftovers == []  # a failed unpacking leaves nothing behind
    assert infer(protocol, server, "env_folder")[0] == [3.0, 6.0, 9.0]  # others still serve


def test_environment_of_another_python_version_is_a_load_error(tmp_path):
    python = other_python()
    if python is None:
        pytest.skip("no Python of another major.minor on this machine")
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env = make_venv(tmp_path / "other", python=python, numpy_too=False)
    add_model(tmp_path / "models", "other_python", str(env))
    variables = dict(os.environ, **{env_cache.CACHE_ENVIRONMENT: str(tmp_path / "cache")})
    args = ["--model-repository", str(tmp_path / "models"), "--model-control-mode=explicit"]
    with ServerProcess(args, env=variables) as running:
        message = _load_error("grpc", running, "other_python")
    server_version = "%d.%d" % sys.version_info[:2]
    assert f"'{env}' has Python {version}" in message, message
    assert f"need Python {server_version}" in message, message


# --- the probe's verdict, case by case ---

@pytest.mark.parametrize("report, says", [
    ({"version": [3, 11], "numpy": "2.0"}, None),
    ({"version": [3, 12], "numpy": "2.0"}, "has Python 3.12, but Python models of this "
                                           "server need Python 3.11"),
    ({"version": [2, 7], "numpy_error": "ImportError: x"}, "has Python 2.7"),
    ({"version": [3, 11], "numpy_error": "ModuleNotFoundError: No module named 'numpy'"},
     "cannot import numpy, which Python models need: ModuleNotFoundError"),
    ({"version": [3, 11], "numpy": "2.0", "worker_error": "ImportError: y"},
     "cannot run the model's worker: ImportError: y"),
    ({"failure": "exited with status 127: bash: no such file"},
     "cannot run Python: its interpreter exited with status 127"),
])
def test_report_problem(report, says):
    problem = exec_env.report_problem(report, (3, 11))
    assert problem == says if says is None else says in problem


# --- the execution mode a model with an environment gets ---

def _settings(parameters: dict[str, str]):
    from tritonclient.grpc import model_config_pb2 as mc

    from mini_triton.backends.python.backend import PythonSettings

    config = mc.ModelConfig(name="m", backend="python")
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return PythonSettings.from_config(config)


def test_environment_implies_process_mode_over_the_server_wide_default(monkeypatch):
    monkeypatch.setenv("MINI_TRITON_PYTHON_EXECUTION_MODE", "thread")
    assert _settings({}).mode == "thread"
    assert _settings({"EXECUTION_ENV_PATH": "/envs/a.tar.gz"}).mode == "process"
    assert _settings({"EXECUTION_ENV_PATH": ""}).mode == "thread"  # empty: none, as in Triton

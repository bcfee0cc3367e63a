"""A Python model's own execution environment (python_backend's `EXECUTION_ENV_PATH`).

The parameter names a folder (a conda environment, a conda-pack archive unpacked,
a venv) or a conda-pack archive (`.tar.gz`, unpacked once into a cache: env_cache.py);
`$$TRITON_MODEL_DIRECTORY` in it stands for the model's folder. Each worker of
the model is then started as python_backend starts its stub: the environment's
`bin/activate` is sourced, `<env>/lib` leads `LD_LIBRARY_PATH`, and the
environment's `bin/python` runs the worker. The worker is our own Python code;
it needs only the standard library and numpy, so the interpreter is given our
package alone on its path (a folder holding a link to it), never the server's
other packages: the model sees the environment's packages, as under Triton.

Before a model loads, its environment is checked by running that interpreter
once: it must be the server's Python major.minor (our worker speaks to the
server in pickles and runs the server's code), import numpy (Triton requires it
too) and import the worker. Any failure is a load error naming the path and
what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ... import PACKAGE_DIR
from ...core.errors import internal
from . import env_cache
from .env_archive import UnpackLimits

log = logging.getLogger("mini_triton.python")

EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
PROBE_TIMEOUT_S = 120.0  # a cold conda environment on a slow disk takes its time
_PROBE_MARK = "mini-triton-env-probe:"
_ERROR_TAIL_CHARS = 2000
# Source the environment's activate script (as python_backend does), put its lib/
# first on the library path, then run the interpreter with the arguments given.
_LAUNCH = ('source "$1/bin/activate" || exit 97; '
           'export LD_LIBRARY_PATH="$1/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; '
           'shift; exec "$@"')
# Run by the environment's interpreter before any model loads: its version, and
# whether numpy and our worker import. Python 2 must be able to parse it too.
_PROBE = f"""
import json, sys
report = {{"version": list(sys.version_info[:2]), "prefix": sys.prefix}}
try:
    import numpy
    report["numpy"] = numpy.__version__
except Exception as error:
    report["numpy_error"] = "%s: %s" % (type(error).__name__, error)
else:
    try:
        import mini_triton.backends.python.worker
    except Exception as error:
        report["worker_error"] = "%s: %s" % (type(error).__name__, error)
sys.stdout.write({_PROBE_MARK!r} + json.dumps(report) + "\\n")
"""


@dataclass(frozen=True)
class ExecutionEnvironment:
    """A checked environment: how to start a Python process in it."""

    source: str  # EXECUTION_ENV_PATH, with $$TRITON_MODEL_DIRECTORY expanded
    root: Path  # the environment's folder (for an archive, where it was unpacked)
    version: tuple[int, int] | None = None  # the interpreter's, once checked
    # The server's hold on an archive's unpacked copy (None for a folder): kept while
    # the model is loaded, and inherited by every worker started in it (see env_cache).
    lease: env_cache.Lease | None = field(default=None, compare=False)

    @property
    def inherited_fds(self) -> tuple[int, ...]:
        """Descriptors a worker started here must inherit: its own hold on the copy."""
        return (self.lease.fd,) if self.lease is not None else ()

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def command(self, arguments: list[str]) -> list[str]:
        """The command line that runs the environment's interpreter with `arguments`,
        after its activate script. `-s`: no user site-packages (they would shadow the
        environment's); `-P` (3.11+): the working folder is not put on the path."""
        flags = ["-s", "-P"] if self.version and self.version >= (3, 11) else ["-s"]
        return ["bash", "-c", _LAUNCH, "mini-triton-env", str(self.root), str(self.python),
                *flags, *arguments]

    def variables(self, base: dict[str, str]) -> dict[str, str]:
        """The process environment: the server's, with our package alone on the path
        (the server's PYTHONPATH and PYTHONHOME would bring its own packages)."""
        variables = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        variables["PYTHONPATH"] = str(worker_path())
        return variables

    def describe(self) -> str:
        if Path(self.source) != self.root:
            return f"'{self.source}' (unpacked in '{self.root}')"
        return f"'{self.source}'"


def configured_path(config: mc.ModelConfig, model_dir: Path) -> str | None:
    """The model's EXECUTION_ENV_PATH with `$$TRITON_MODEL_DIRECTORY` replaced by its
    folder (as python_backend does, the first occurrence); None when unset or empty."""
    if EXECUTION_ENV_PATH not in config.parameters:
        return None
    value = config.parameters[EXECUTION_ENV_PATH].string_value
    if not value:
        return None
    return value.replace(MODEL_DIRECTORY_KEYWORD, str(model_dir), 1)


def from_config(config: mc.ModelConfig, model_dir: Path,
                limits: UnpackLimits = UnpackLimits(),
                uploaded: bool = False) -> ExecutionEnvironment | None:
    """The model's checked environment, unpacking an archive first (within `limits`;
    `uploaded`: the model's folder was written from a load request, so an archive in
    it is keyed by content and deleted once unused); None when the model runs in the
    server's own Python. Raises a TritonError (INTERNAL) naming the path and what is
    wrong with it."""
    source = configured_path(config, model_dir)
    if source is None:
        return None
    log.info("Using Python execution env %s", source)  # python_backend's line
    try:
        resolved = Path(os.path.realpath(source, strict=True))
    except OSError:
        raise internal(f"Failed to get the canonical path for {source}.") from None
    uploaded = uploaded and resolved.is_relative_to(Path(model_dir).resolve())
    lease = None if resolved.is_dir() else env_cache.acquire(resolved, limits, uploaded)
    environment = ExecutionEnvironment(source, lease.copy if lease else resolved, lease=lease)
    try:
        version = _checked_version(environment)
    except BaseException:
        release(environment)
        raise
    return ExecutionEnvironment(source, environment.root, version, lease)


def release(environment: ExecutionEnvironment | None) -> None:
    """The model no longer uses `environment`: let go of its unpacked copy (its workers
    keep it until they end), pruning copies of the archive nothing uses any more."""
    if environment is not None and environment.lease is not None:
        environment.lease.release()


def _checked_version(environment: ExecutionEnvironment) -> tuple[int, int]:
    """The environment interpreter's version, once it is found fit to run our workers."""
    _require_file(environment.root / "bin" / "activate", "an 'activate' script")
    _require_file(environment.python, "a Python interpreter ('bin/python')")
    report = _probe(environment)
    problem = report_problem(report, sys.version_info[:2])
    if problem:
        raise internal(f"The Python execution environment {environment.describe()} {problem}")
    return tuple(report["version"])


def _require_file(path: Path, what: str) -> None:
    """python_backend's message for a missing activate script, for each part we need."""
    if not path.is_file():
        raise internal(f"Path {path} does not exist. The Python environment should contain "
                       f"{what}.")


def _probe(environment: ExecutionEnvironment) -> dict:
    """Run the probe with the environment's interpreter, as a worker would be run
    (the version still unknown: in our folder, which `-c` puts on the path); its
    report, or one that says why none came."""
    variables = environment.variables(dict(os.environ))
    try:
        done = subprocess.run(
            environment.command(["-c", _PROBE]), env=variables, cwd=variables["PYTHONPATH"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
            timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"failure": f"did not answer within {PROBE_TIMEOUT_S:.0f} s"}
    except OSError as error:
        return {"failure": f"could not be started: {error}"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_PROBE_MARK):
            try:
                return json.loads(line[len(_PROBE_MARK):])
            except ValueError:
                break
    output = (done.stderr or done.stdout).strip()[-_ERROR_TAIL_CHARS:]
    if done.returncode == 97:
        return {"failure": f"failed in its activate script: {output}"}
    return {"failure": f"exited with status {done.returncode}: {output}"}


def report_problem(report: dict, server_version: tuple[int, int]) -> str | None:
    """What makes the probed environment unfit for our workers (completing the
    sentence 'The Python execution environment X ...'), or None."""
    if "failure" in report:
        return f"cannot run Python: its interpreter {report['failure']}"
    version = tuple(report.get("version", ()))
    if version[:2] != tuple(server_version):
        found = ".".join(map(str, version)) or "an unknown version"
        wanted = ".".join(map(str, server_version))
        return (f"has Python {found}, but Python models of this server need Python {wanted}, "
                "the server's own")
    if "numpy_error" in report:
        return f"cannot import numpy, which Python models need: {report['numpy_error']}"
    if "worker_error" in report:
        return f"cannot run the model's worker: {report['worker_error']}"
    return None


def worker_path() -> Path:
    """A folder holding only a link to our package: the worker's whole PYTHONPATH."""
    digest = hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:16]
    folder = env_cache.cache_root() / f"worker-{digest}"
    link = folder / "mini_triton"
    if os.path.islink(link) and os.readlink(link) == str(PACKAGE_DIR):
        return folder
    folder.mkdir(mode=0o700, exist_ok=True)
    # One staging name per thread: loads run side by side, and one's unlink must not
    # take away another's staged link before it is moved into place.
    staged = folder / f".mini_triton-{os.getpid()}-{threading.get_ident()}"
    if os.path.lexists(staged):
        os.unlink(staged)
    os.symlink(PACKAGE_DIR, staged)
    os.replace(staged, link)  # atomic: a worker starting meanwhile sees one or the other
    return folder

"""Running a `TritonPythonModel` as Triton does, wherever it runs (a worker
process or a server thread): import `model.py`, `auto_complete_config`,
`initialize(args)`, `execute(requests)` (sync or `async def`), `is_ready`,
`finalize`. Errors read as Triton's do, so clients see the same messages.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import threading
import traceback
from pathlib import Path

from ... import PACKAGE_DIR
from ...core.files import check_regular
from . import utils as pb

log = logging.getLogger("mini_triton.backends.python")
_PACKAGE_NUMBERS = itertools.count()
MODULE_ALIAS = "triton_python_backend_utils"


def install_module_alias() -> None:
    """Make `import triton_python_backend_utils` return this backend's module."""
    sys.modules.setdefault(MODULE_ALIAS, pb)


class ModelError(Exception):
    """Model code failed; the message is what the client (or the load error) shows."""


_OWN_FILES = str(PACKAGE_DIR)
_HIDDEN_FILES = (_OWN_FILES, str(Path(asyncio.__file__).parent),
                 str(Path(threading.__file__).parent / "concurrent"))


def describe_exception(error: BaseException) -> str:
    """'ValueError: message' followed by where it was raised, innermost frame first:
    the model's own frames only, as Triton's stub (C++ around the model) shows them."""
    text = f"{type(error).__name__}: {error}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not frame.filename.startswith(_HIDDEN_FILES)]
    if frames:
        text += "\n\nAt:\n" + "".join(
            f"  {frame.filename}({frame.lineno}): {frame.name}\n" for frame in reversed(frames))
    return text


def import_model(model_file: Path, label: str):
    """Import `model_file` as the module of a package over its folder, so both
    `import helper` and `from . import helper` find the files next to it."""
    folder = model_file.parent
    for path in (str(folder), str(folder.parent)):
        if path not in sys.path:
            sys.path.append(path)
    safe_label = re.sub(r"\W", "_", label)
    package_name = f"_triton_model_{safe_label}_{next(_PACKAGE_NUMBERS)}"
    package = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec(package_name, None, is_package=True))
    package.__path__ = [str(folder)]
    sys.modules[package_name] = package
    module_name = f"{package_name}.{model_file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, model_file)
    if spec is None or spec.loader is None:
        raise ModelError(f"Python model file not found in '{model_file}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        sys.modules.pop(package_name, None)
        raise
    return module


# Past this many files and folders the scan stops and the worker is asked anyway: asking
# is always right; the scan only spares a process start for the usual small model folder.
_SCANNED_ENTRIES = 500
_CHUNK = 1 << 20


def mentions_auto_complete(model_file: Path) -> bool:
    """Whether model code may define `auto_complete_config` (a cheap look before starting
    a process only to ask). The model may import its class from any module that Triton's
    stub puts on sys.path: the version folder, the model folder and their subfolders."""
    seen = 0
    for folder, subfolders, names in os.walk(model_file.parent.parent):
        seen += 1 + len(subfolders) + len(names)
        if seen > _SCANNED_ENTRIES:
            return True
        for name in names:
            if name.endswith(".py") and _file_mentions(Path(folder, name),
                                                       b"auto_complete_config"):
                return True
    return False


def _file_mentions(path: Path, word: bytes) -> bool:
    """Whether `word` occurs in the file, read a chunk at a time (a large vendored
    module is never held whole); False for what cannot be read or is no regular file
    (a FIFO named *.py would hold the loading thread)."""
    tail = b""
    try:
        check_regular(path)
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK):
                if word in tail + chunk:
                    return True
                tail = chunk[-len(word):]
    except OSError:
        return False
    return False


def _fail_after_responses(requests: list) -> None:
    """A failed `execute`'s requests that have had a response answer as Triton's do
    (InferenceResponseSender._fail_after_response); the failure goes to the others."""
    for request in requests:
        sender = getattr(request, "_sender", None)
        if sender is not None:
            sender._fail_after_response()


class ModelRunner:
    """One `TritonPythonModel` instance and the event loop its coroutines run on."""

    def __init__(self, model_file: Path, instance_name: str, decoupled: bool = False):
        self.model_file = Path(model_file)
        self.instance_name = instance_name
        self.decoupled = decoupled
        self.model_class = None
        self.model = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set = set()

    def load(self) -> None:
        install_module_alias()
        if not self.model_file.exists():
            raise ModelError(f"Python model file not found in '{self.model_file}'")
        try:
            module = import_model(self.model_file, self.instance_name)
        except Exception as error:
            raise ModelError(describe_exception(error)) from error
        self.model_class = getattr(module, "TritonPythonModel", None)
        if self.model_class is None:
            raise ModelError(f"Python model '{self.model_file}' does not define "
                             "'TritonPythonModel'")

    def auto_complete(self, config_json: str) -> str:
        """The config JSON after the model's `auto_complete_config` (unchanged without one)."""
        function = getattr(self.model_class, "auto_complete_config", None)
        if function is None:
            return config_json
        try:
            completed = function(pb.ModelConfig(config_json))
        except Exception as error:
            raise ModelError(describe_exception(error)) from error
        if not isinstance(completed, pb.ModelConfig):
            raise ModelError(f"auto_complete_config function in model "
                             f"'{self.instance_name}' must return a valid pb.ModelConfig object.")
        return json.dumps(completed._model_config)

    def initialize(self, args: dict) -> None:
        try:
            self.model = self.model_class()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(args)
                if asyncio.iscoroutine(result):
                    self._run(result)
        except Exception as error:
            raise ModelError(describe_exception(error)) from error

    def execute(self, requests: list) -> list | None:
        """The model's responses, one per request (None: it uses response senders).
        Raises ModelError with Triton's message when the model fails."""
        try:
            result = self._call_execute(requests)
            return self._check_result(result, requests)
        except ModelError as error:
            message = self._failure(str(error))
        except Exception as error:
            message = self._failure(describe_exception(error))
            log.debug("execute of '%s' raised", self.instance_name, exc_info=error)
        log.error("%s", message)  # as Triton's stub logs it
        _fail_after_responses(requests)
        raise ModelError(message)

    def _failure(self, message: str) -> str:
        return (f"Failed to process the request(s) for model '{self.instance_name}', "
                f"message: {message}")

    def _call_execute(self, requests: list):
        execute = getattr(self.model, "execute", None)
        if execute is None:
            raise ModelError(f"Python model {self.model_file} does not implement `execute` "
                             "method.")
        result = execute(requests)
        if type(result) is not list and asyncio.iscoroutine(result):  # most return a list
            if self.decoupled:
                self._run_in_background(result)
                return None
            return self._run(result)
        return result

    def _check_result(self, result, requests: list) -> list | None:
        if result is None:
            return None
        if self.decoupled:
            raise ModelError(f"Python model '{self.instance_name}' is using the decoupled mode "
                             "and the execute function must return None.")
        if not isinstance(result, list):
            raise ModelError("Expected a list in the execute return, found type "
                             f"'{type(result).__name__}'.")
        if len(result) != len(requests):
            raise ModelError(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, and "
                f"InferenceResponse(s) size is:{len(result)}\n")
        response_class = pb.InferenceResponse
        for response in result:
            if type(response) is not response_class and response is not None \
                    and not isinstance(response, response_class):
                raise ModelError("Expected an 'InferenceResponse' object in the execute "
                                 f"function return list, found type '{type(response).__name__}'.")
        return result

    def is_ready(self) -> bool | None:
        """The model's own `is_ready()` answer; None when it defines none."""
        function = getattr(self.model, "is_ready", None)
        if function is None:
            return None
        try:
            result = function()
            if asyncio.iscoroutine(result):
                result = self._run(result)
        except Exception as error:
            log.error("is_ready of '%s' failed: %s", self.instance_name,
                      describe_exception(error))
            return False
        return result if isinstance(result, bool) else False

    def has_is_ready(self) -> bool:
        return getattr(self.model, "is_ready", None) is not None

    def finalize(self) -> None:
        finalize = getattr(self.model, "finalize", None)
        try:
            if finalize is not None:
                result = finalize()
                if asyncio.iscoroutine(result):
                    self._run(result)
        except Exception as error:
            log.error("finalize of '%s' failed: %s", self.instance_name,
                      describe_exception(error))
        finally:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)

    # --- coroutines run on the runner's own loop, in its own thread (as Triton does) ---

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True,
                             name=f"{self.instance_name}-asyncio").start()
        return self._loop

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._event_loop()).result()

    def _run_in_background(self, coroutine) -> None:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._event_loop())
        self._background.add(future)
        future.add_done_callback(self._background_done)

    def _background_done(self, future) -> None:
        self._background.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("execute of '%s' failed: %s", self.instance_name,
                      describe_exception(future.exception()))

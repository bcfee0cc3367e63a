"""The Python backend: models written for NVIDIA Triton's Python backend,
served unchanged (`backend: "python"`, `1/model.py` with `TritonPythonModel`).

Per-model settings are `parameters` of the config (see `PythonSettings`);
the execution mode picks `ProcessInstance` (the default) or `ThreadInstance`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ...config.json_format import config_from_json, config_to_json
from ...core.errors import invalid_arg, unavailable
from ...core.files import check_regular
from ..backend_config import settings_for
from ..base import Backend, ModelContext, ModelInstance
from . import exec_env, process_mode, worker_process
from .env_archive import UnpackLimits
from .bridge import ServerBridge
from .exec_env import EXECUTION_ENV_PATH
from .restarts import RestartPolicy
from .runner import ModelError, ModelRunner, install_module_alias, mentions_auto_complete

log = logging.getLogger("mini_triton.backends.python")

EXECUTION_MODE = "execution_mode"  # "process" (default) or "thread"
AUTO_STACK = "auto_stack"  # "true": execute gets one request holding the whole batch
EXECUTE_TIMEOUT_MS = "execute_timeout_ms"  # give up on an execute after this long
MODE_ENVIRONMENT = "MINI_TRITON_PYTHON_EXECUTION_MODE"  # server-wide default mode
# How long an idle worker may poll for its next batch while its model is lightly
# loaded (process mode; 0: never, sleep at once). See wire.PollBudget.
BUSY_POLL_US = "busy_poll_us"
BUSY_POLL_ENVIRONMENT = "MINI_TRITON_PYTHON_BUSY_POLL_US"  # server-wide default
DEFAULT_BUSY_POLL_US = "1000"
_MODES = ("process", "thread")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


@dataclass(frozen=True)
class PythonSettings:
    """What the config's `parameters` choose for a Python model."""

    mode: str = "process"
    auto_stack: bool = False
    execute_timeout_s: float | None = None
    drain_s: float = 5.0  # at unload, how long open (decoupled) requests may take to finish
    busy_poll_ns: int = 0

    @classmethod
    def from_config(cls, config: mc.ModelConfig, drain_s: float = 5.0) -> "PythonSettings":
        def parameter(key: str, default: str) -> str:
            if key in config.parameters:
                return config.parameters[key].string_value.strip().lower()
            return default

        # A model with its own environment runs in a worker process: a thread-mode
        # model would run in the server's Python instead.
        own_env = bool(EXECUTION_ENV_PATH in config.parameters
                       and config.parameters[EXECUTION_ENV_PATH].string_value)
        mode = parameter(EXECUTION_MODE, "process" if own_env else
                         os.environ.get(MODE_ENVIRONMENT, "process").lower())
        if mode not in _MODES:
            raise invalid_arg(f"parameter '{EXECUTION_MODE}' of model '{config.name}' must be "
                              f"'process' or 'thread', not '{mode}'")
        if own_env and mode == "thread":
            raise invalid_arg(f"parameter '{EXECUTION_ENV_PATH}' of model '{config.name}' needs "
                              f"'{EXECUTION_MODE}' 'process': a thread-mode model runs in the "
                              "server's own Python")
        stack = parameter(AUTO_STACK, "false")
        if stack not in _TRUE + _FALSE:
            raise invalid_arg(f"parameter '{AUTO_STACK}' of model '{config.name}' must be "
                              f"'true' or 'false', not '{stack}'")
        timeout = parameter(EXECUTE_TIMEOUT_MS, "0") or "0"
        try:
            timeout_ms = float(timeout)
        except ValueError:
            raise invalid_arg(f"parameter '{EXECUTE_TIMEOUT_MS}' of model '{config.name}' must "
                              f"be a number of milliseconds, not '{timeout}'") from None
        poll = parameter(BUSY_POLL_US, os.environ.get(BUSY_POLL_ENVIRONMENT,
                                                      DEFAULT_BUSY_POLL_US)) or "0"
        if not poll.isdigit():
            raise invalid_arg(f"parameter '{BUSY_POLL_US}' of model '{config.name}' must be a "
                              f"whole number of microseconds, not '{poll}'")
        return cls(mode, stack in _TRUE, timeout_ms / 1000.0 if timeout_ms > 0 else None,
                   drain_s, min(int(poll), 1_000_000) * 1000)

    def deadline_s(self, requests: list) -> float | None:
        """How long one execute of `requests` may take: the shortest request timeout
        (the client's `timeout` parameter) or the model's execute timeout, if any."""
        limit = self.execute_timeout_s or None  # asked per batch: no list, no min()
        for request in requests:
            if request.timeout_us and (limit is None or request.timeout_us / 1e6 < limit):
                limit = request.timeout_us / 1e6
        return limit


def model_file_of(config: mc.ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or "model.py")


def _environment(config: mc.ModelConfig, context: ModelContext):
    """The model's execution environment (exec_env), unpacked within the limits of the
    python backend's --backend-config settings."""
    limits = UnpackLimits.from_settings(settings_for(context.options, "python"))
    return exec_env.from_config(config, context.model_dir, limits, context.uploaded)


def _archive_stamp(config: mc.ModelConfig, model_dir: Path) -> tuple | None:
    """EXECUTION_ENV_PATH as it is now: (path, mtime, size), None when unset or absent."""
    source = exec_env.configured_path(config, model_dir)
    try:
        info = os.stat(source) if source is not None else None
    except OSError:
        return None
    return None if info is None else (source, info.st_mtime_ns, info.st_size)


class PythonBackend(Backend):
    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        """Triton's auto-complete for Python models: the model's `auto_complete_config`."""
        settings = PythonSettings.from_config(config)
        model_file = model_file_of(config, context.version_dir)
        if not model_file.is_file():
            return  # loading reports the missing file, or what it is instead
        config_json = json.dumps(config_to_json(config, including_defaults=True))
        if settings.mode == "thread":
            # Its errors name the model as Triton's do ('auto_complete_config function in
            # model 'm' ...'), not an instance.
            runner = ModelRunner(model_file, config.name)
            try:
                runner.load()
                completed = runner.auto_complete(config_json)
            except ModelError as error:
                raise unavailable(str(error)) from None
        elif mentions_auto_complete(model_file):
            environment = _environment(config, context)
            try:
                completed = worker_process.auto_complete(model_file, config_json, config.name,
                                                         environment)
            finally:
                exec_env.release(environment)
        else:
            return
        config.CopyFrom(config_from_json(completed))

    def __init__(self, context: ModelContext):
        super().__init__(context)
        install_module_alias()
        drain_s = float(context.options.get("exit_timeout_secs", 5.0) or 5.0)
        self.settings = PythonSettings.from_config(self.config, min(drain_s, 30.0))
        self.decoupled = self.config.model_transaction_policy.decoupled
        if self.settings.auto_stack and self.decoupled:
            raise invalid_arg(f"parameter '{AUTO_STACK}' cannot be used with the decoupled "
                              f"model '{self.config.name}'")
        if self.settings.auto_stack and (self.config.batch_input or any(
                t.allow_ragged_batch for t in self.config.input)):
            raise invalid_arg(f"parameter '{AUTO_STACK}' cannot be used with batch_input or "
                              f"allow_ragged_batch (model '{self.config.name}'): its requests "
                              "would not stack into rows")
        self.model_file = model_file_of(self.config, context.version_dir)
        if not self.model_file.exists():
            raise unavailable(f"Python model file not found in '{self.model_file}'")
        try:
            check_regular(self.model_file)  # a FIFO would hold the process importing it
        except OSError as error:
            raise unavailable(f"Python model file {error}") from None
        self.environment = (_environment(self.config, context)
                            if self.settings.mode == "process" else None)
        self.environment_stamp = _archive_stamp(self.config, context.model_dir)
        self.restart_policy = RestartPolicy.from_settings(settings_for(context.options,
                                                                       "python"))
        self.bridge = ServerBridge(context, self)
        self.instances: list[ModelInstance] = []
        self._config_json = json.dumps(config_to_json(self.config, including_defaults=True))

    def create_instance(self, index: int, kind: str, device_id: int) -> ModelInstance:
        name = self._instance_name(index)
        # Triton's Python backend line, which log readers look for per instance.
        log.info("TRITONBACKEND_ModelInstanceInitialize: %s (%s device %d)", name,
                 kind.removeprefix("KIND_"), device_id)
        args = {
            "model_config": self._config_json,
            "model_instance_kind": kind.removeprefix("KIND_"),
            "model_instance_name": name,
            "model_instance_device_id": str(device_id),
            "model_repository": str(self.context.model_dir),
            "model_version": str(self.context.version),
            "model_name": self.context.name,
        }
        if self.settings.mode == "thread":
            from .thread_mode import ThreadInstance

            instance = ThreadInstance(self, name, args)
        else:
            instance = process_mode.ProcessInstance(self, name, args)
        self.instances.append(instance)
        return instance

    def _instance_name(self, index: int) -> str:
        """Triton's '<group name>_<index in group>'."""
        for group in self.config.instance_group:
            if index < group.count:
                return f"{group.name or self.config.name}_{index}"
            index -= group.count
        return f"{self.config.name}_{index}"

    def files_changed(self) -> bool:
        """Its execution environment (an archive may lie anywhere) changed: a load
        reloads the model, which unpacks it anew."""
        return _archive_stamp(self.config, self.context.model_dir) != self.environment_stamp

    def update_instance_group(self, config: mc.ModelConfig) -> None:
        """New instances are told the new groups, as their `args['model_config']`."""
        super().update_instance_group(config)
        self._config_json = json.dumps(config_to_json(self.config, including_defaults=True))

    def instance_retired(self, instance: ModelInstance) -> None:
        self.instances = [i for i in self.instances if i is not instance]

    def is_ready(self) -> bool:
        """Every instance healthy, and the model's own `is_ready()` (if any) says so."""
        return all(instance.is_ready() for instance in self.instances)

    def instances_up(self) -> bool:
        """Whether every instance has a worker serving (none is restarting one)."""
        return not any(getattr(instance, "down", None) for instance in self.instances)

    def serves_without(self, instance: ModelInstance) -> bool:
        """Whether an instance other than `instance` has a worker serving."""
        return any(other is not instance and not getattr(other, "down", None)
                   for other in self.instances)

    def unload(self) -> None:
        for instance in self.instances:
            abandon = getattr(instance, "abandon", None)
            if abandon is not None and not instance.stopping:
                abandon()  # stuck in execute past the unload timeout
        self.bridge.release()
        exec_env.release(self.environment)  # an abandoned worker keeps its copy itself

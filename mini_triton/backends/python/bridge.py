"""What a Python model asks of the server, answered in the server process:
BLS calls (through the InferenceService, on its event loop), custom metrics,
model control. Both execution modes use one `ServerBridge` per model version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

from ...core.errors import Code, TritonError, internal, unavailable
from . import convert
from .convert import BlsCall, Reply
from .custom_metrics import registry_for

log = logging.getLogger("mini_triton.backends.python")

Deliver = Callable[[Reply, bool], None]  # (response, final), called on the event loop


class ServerBridge:
    def __init__(self, context, backend=None):
        self.context = context
        self.backend = backend
        self.service = context.server
        self.metrics = registry_for(self.service) if self.service is not None else None
        self._unavailable = False

    # --- BLS ---

    def infer(self, call: BlsCall, decoupled: bool, deliver: Deliver) -> None:
        """Start a BLS call; `deliver` receives every response, the last one final.
        Errors come back as error responses, never as exceptions."""
        loop = getattr(self.service, "loop", None)
        if loop is None or loop.is_closed():
            deliver(convert.error_reply(unavailable("the server is not serving")), True)
            return
        asyncio.run_coroutine_threadsafe(self._infer(call, decoupled, deliver), loop)

    async def _infer(self, call: BlsCall, decoupled: bool, deliver: Deliver) -> None:
        try:
            request = convert.core_request(call)
            if not decoupled and self._is_decoupled(call):
                raise TritonError(
                    Code.INVALID_ARG,
                    f"model '{call.model_name}' uses the decoupled transaction policy: call "
                    "exec(decoupled=True) or async_exec(decoupled=True)")
            stream = self.service.infer(request)
            async for response in stream:
                deliver(convert.reply_from_core(response), response.final)
        except TritonError as error:
            deliver(convert.error_reply(error), True)
        except Exception as error:  # never leave a model waiting
            log.exception("BLS request to '%s' failed", call.model_name)
            deliver(convert.error_reply(internal(f"BLS request failed: {error}")), True)

    def _is_decoupled(self, call: BlsCall) -> bool:
        try:
            version = str(call.model_version) if call.model_version >= 0 else ""
            config = self.service.model_config(call.model_name, version)
        except TritonError:
            return False  # the infer call reports the missing model in Triton's words
        return config.model_transaction_policy.decoupled

    # --- custom metrics ---

    def metric_family(self, name: str, description: str, kind: str) -> None:
        self._registry().declare(self, name, description, kind)

    def metric_create(self, name: str, labels: dict, buckets) -> None:
        self._registry().create(self, name, labels, buckets)

    def metric_update(self, name: str, labels: dict, op: str, value: float) -> None:
        self._registry().update(name, labels, op, value)

    def metric_value(self, name: str, labels: dict) -> float:
        return self._registry().value(name, labels)

    def _registry(self):
        if self.metrics is None:
            raise unavailable("custom metrics need a running server")
        return self.metrics

    # --- model control (explicit mode) ---

    def load_model(self, name: str, config: str, files: dict) -> None:
        self._manager().load(name, config or None, files or None)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._manager().unload(name, unload_dependents)

    def is_model_ready(self, name: str, version: str) -> bool:
        return self._manager().is_ready(name, version)

    def _manager(self):
        manager = getattr(self.service, "manager", None)
        if manager is None:
            raise unavailable("model control needs a running server")
        return manager

    # --- health ---

    def mark_unavailable(self, reason: str) -> None:
        """Take this model version out of service (once), without blocking the caller."""
        if self._unavailable:
            return
        self._unavailable = True
        manager = getattr(self.service, "manager", None)
        if manager is None or not hasattr(manager, "mark_unavailable"):
            log.error("%s", reason)
            return
        threading.Thread(target=self._take_down, args=(manager, reason), daemon=True,
                         name=f"{self.context.name}-unavailable").start()

    def instance_down(self, reason: str) -> None:
        """An instance lost its worker and restarts it: the version shows not ready,
        with `reason`, until `instance_restarted`."""
        manager = getattr(self.service, "manager", None)
        if manager is not None and hasattr(manager, "mark_restarting"):
            manager.mark_restarting(self.context.name, self.context.version, reason,
                                    self.context.namespace, self.backend)

    def instance_restarted(self) -> None:
        """An instance serves again: the version is ready once all its instances are."""
        manager = getattr(self.service, "manager", None)
        if manager is not None and hasattr(manager, "mark_restarted") and \
                self.backend.instances_up():
            manager.mark_restarted(self.context.name, self.context.version,
                                   self.context.namespace, self.backend)

    def _take_down(self, manager, reason: str) -> None:
        # Nothing happens if this version no longer serves with this backend (it was
        # reloaded or unloaded meanwhile).
        manager.mark_unavailable(self.context.name, self.context.version, reason,
                                 self.context.namespace, self.backend)

    def release(self) -> None:
        if self.metrics is not None:
            self.metrics.release(self)

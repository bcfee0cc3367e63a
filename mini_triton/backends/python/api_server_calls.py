"""What a model asks of the server through `triton_python_backend_utils`: log lines,
custom metrics and model control."""

from __future__ import annotations

import logging
import re
import sys

from . import api_args as _args
from .api_core import TritonModelException, _current_host

_P = _args.Param

# --- logging ---

_log = logging.getLogger("triton_python_backend_utils")


class Logger:
    """Log lines from model code into the server's log."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=logging.INFO):
        if not isinstance(message, str) or type(level) is bool or level not in _LEVELS:
            raise _args.incompatible("log", _LOG_SIGNATURE, (message, level), {})
        _log_from_model(message, level)

    @staticmethod
    def log_info(message):
        _log_at("log_info", message, logging.INFO)

    @staticmethod
    def log_warn(message):
        _log_at("log_warn", message, logging.WARNING)

    @staticmethod
    def log_error(message):
        _log_at("log_error", message, logging.ERROR)

    @staticmethod
    def log_verbose(message):
        _log_at("log_verbose", message, logging.DEBUG)


_LEVELS = frozenset((logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG))
_LOG_SIGNATURE = (f"(message: str, level: {_args.bound('Logger.LogLevel')} = "
                  "<LogLevel.INFO: 0>) -> None")


def _log_at(function: str, message, level: int) -> None:
    """Logger.log_info and its siblings: one `message: str` (checked as Triton's
    binding checks it)."""
    if not isinstance(message, str):
        raise _args.incompatible(function, "(message: str) -> None", (message,), {})
    _log_from_model(message, level)


def _log_from_model(message: str, level: int) -> None:
    # The model's own file and line, as Triton's stub logs them (`model.py:28]`): the
    # caller of Logger.log (3 frames up), or of Logger.log_info through _log_at (4 up).
    stacklevel = 4 if sys._getframe(1).f_code is _log_at.__code__ else 3
    _log.log(level, "%s", message, stacklevel=stacklevel)


# --- custom metrics (shown on the server's metrics endpoint) ---


class MetricKind:
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


_KIND_NAMES = {MetricKind.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
               MetricKind.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
               MetricKind.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}
# Prometheus' rules, which Triton's server applies to what a model declares.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _refused(action: str, message: str) -> TritonModelException:
    """Triton's words for a metric call its server refuses."""
    host = _current_host()
    instance = getattr(host, "instance_name", "") if host is not None else ""
    return TritonModelException(f"{action}: Failed to process the request for model "
                                f"'{instance}', message: {message}")


def _unsupported(action: str, kind: str, operation: str) -> TritonModelException:
    return _refused(action, f"{_KIND_NAMES[kind]} does not support {operation}")


class MetricFamily:
    """A named family of metrics: `MetricFamily(name, description, kind)`."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    @_args.checked("__init__", f"{_args.bound('MetricFamily')}(name: str, description: str, "
                   f"kind: {_args.bound('MetricKind')})", _P("name", _args.is_str),
                   _P("description", _args.is_str),
                   _P("kind", _args.one_of((MetricKind.COUNTER, MetricKind.GAUGE,
                                            MetricKind.HISTOGRAM))))
    def __init__(self, name, description, kind):
        if not _METRIC_NAME.match(name):
            raise _refused("Error when creating MetricFamily", "Invalid metric name")
        self._host = _current_host()
        self._name, self._description, self._kind = name, str(description), kind
        self._host.metric_family(name, self._description, kind)

    def Metric(self, labels=None, buckets=None):
        _check_metric_arguments(self._kind, labels, buckets)
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(value, str):
                raise _refused("Error when creating Metric",
                               "attempt to access JSON non-string as string")
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                raise _refused("Error when creating Metric", "Invalid label name")
        if buckets is not None:
            buckets = [float(b) for b in buckets]
            if buckets != sorted(set(buckets)):
                raise _refused("Error when creating Metric",
                               "Bucket Boundaries must be strictly sorted")
        self._host.metric_create(self._name, labels, buckets)
        return Metric(self, labels)


def _check_metric_arguments(kind: str, labels, buckets) -> None:
    """Triton's checks of MetricFamily.Metric's arguments, in its words."""
    if labels is not None and not isinstance(labels, dict):
        raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
    if buckets is not None and not isinstance(buckets, list):
        raise TritonModelException("Failed to create metric. Buckets must be a list.")
    if kind == MetricKind.HISTOGRAM and buckets is None:
        raise TritonModelException("Failed to create metric. Missing required buckets.")
    if kind != MetricKind.HISTOGRAM and buckets is not None:
        raise TritonModelException("Failed to create metric. Unexpected buckets found.")


def _value_method(name: str):
    """A Metric method taking one float, checked as Triton's binding checks it."""
    return _args.checked(name, f"(self: {_args.bound('Metric')}, arg0: float) -> None",
                         _P("value", _args.is_float), self_shown=True)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict):
        self._family = family
        self._labels = labels

    def _update(self, op: str, value) -> None:
        self._family._host.metric_update(self._family._name, self._labels, op, float(value))

    @_value_method("increment")
    def increment(self, value):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise _unsupported("Failed to increment metric value", MetricKind.HISTOGRAM,
                               "Increment")
        if self._family._kind == MetricKind.COUNTER and value < 0:
            raise _refused("Failed to increment metric value", "TRITONSERVER_METRIC_KIND_COUNTER "
                           "can only be incremented monotonically by non-negative values.")
        self._update("increment", value)

    @_value_method("set")
    def set(self, value):
        if self._family._kind != MetricKind.GAUGE:
            raise _unsupported("Failed to set metric value", self._family._kind, "Set")
        self._update("set", value)

    @_value_method("observe")
    def observe(self, value):
        if self._family._kind != MetricKind.HISTOGRAM:
            raise _unsupported("Failed to observe metric value", self._family._kind, "Observe")
        self._update("observe", value)

    def value(self):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise _unsupported("Failed to get metric value", MetricKind.HISTOGRAM, "Value")
        return self._family._host.metric_value(self._family._name, self._labels)


# --- model control (explicit mode) ---


@_args.checked("load_model", "(model_name: str, config: str = '', files: object = None) -> None",
               _P("model_name", _args.is_str), _P("config", _args.is_str, False),
               _P("files", _args.is_anything, False))
def load_model(model_name, config="", files=None):
    _current_host().load_model(model_name, config or "", dict(files or {}))


@_args.checked("unload_model", "(model_name: str, unload_dependents: bool = False) -> None",
               _P("model_name", _args.is_str), _P("unload_dependents", _args.is_bool, False))
def unload_model(model_name, unload_dependents=False):
    _current_host().unload_model(model_name, bool(unload_dependents))


@_args.checked("is_model_ready", "(model_name: str, model_version: str = '') -> bool",
               _P("model_name", _args.is_str), _P("model_version", _args.is_str, False))
def is_model_ready(model_name, model_version=""):
    return bool(_current_host().is_model_ready(model_name, str(model_version)))

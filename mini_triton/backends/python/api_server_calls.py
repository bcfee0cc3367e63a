"""What a model asks of the server through `triton_python_backend_utils`: log lines,
custom metrics and model control."""

from __future__ import annotations

import logging
import sys

from .api_core import TritonModelException, _current_host

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
        # The model's own file and line, as Triton's stub logs them (`model.py:28]`).
        frame = sys._getframe(1)
        stacklevel = 2
        if frame.f_code.co_name.startswith("log_") and frame.f_back is not None:
            stacklevel = 3
        _log.log(level, "%s", message, stacklevel=stacklevel)

    @staticmethod
    def log_info(message):
        Logger.log(message, logging.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, logging.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, logging.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, logging.DEBUG)


# --- custom metrics (shown on the server's metrics endpoint) ---


class MetricKind:
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricFamily:
    """A named family of metrics: `MetricFamily(name, description, kind)`."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        if kind not in (MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM):
            raise TritonModelException(f"unknown metric kind '{kind}'")
        if not name or not isinstance(name, str):
            raise TritonModelException("a metric family needs a name")
        self._host = _current_host()
        self._name, self._description, self._kind = name, str(description), kind
        self._host.metric_family(name, self._description, kind)

    def Metric(self, labels=None, buckets=None):
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("metric labels must map str to str")
        if self._kind == MetricKind.HISTOGRAM:
            if not buckets:
                raise TritonModelException("histogram metrics need 'buckets'")
            buckets = [float(b) for b in buckets]
            if buckets != sorted(set(buckets)):
                raise TritonModelException("histogram buckets must be increasing")
        elif buckets is not None:
            raise TritonModelException(f"{self._kind} metrics take no 'buckets'")
        self._host.metric_create(self._name, labels, buckets)
        return Metric(self, labels)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict):
        self._family = family
        self._labels = labels

    def _update(self, op: str, value) -> None:
        self._family._host.metric_update(self._family._name, self._labels, op, float(value))

    def increment(self, value):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("increment is not supported for histogram metrics")
        if self._family._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException("a counter can only be incremented by a non-negative "
                                       "value")
        self._update("increment", value)

    def set(self, value):
        if self._family._kind != MetricKind.GAUGE:
            raise TritonModelException("set is only supported for gauge metrics")
        self._update("set", value)

    def observe(self, value):
        if self._family._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("observe is only supported for histogram metrics")
        self._update("observe", value)

    def value(self):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("value is not supported for histogram metrics")
        return self._family._host.metric_value(self._family._name, self._labels)


# --- model control (explicit mode) ---


def load_model(model_name, config="", files=None):
    _current_host().load_model(model_name, config or "", dict(files or {}))


def unload_model(model_name, unload_dependents=False):
    _current_host().unload_model(model_name, bool(unload_dependents))


def is_model_ready(model_name, model_version=""):
    return bool(_current_host().is_model_ready(model_name, str(model_version)))

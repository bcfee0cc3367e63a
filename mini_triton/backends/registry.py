"""Backend names → implementations, imported only when a model asks for them,
so an optional backend's missing library never stops the server."""

from __future__ import annotations

import importlib

from ..core.errors import unavailable
from .base import Backend

_BACKENDS = {
    "identity": "mini_triton.backends.identity:IdentityBackend",
    "python": "mini_triton.backends.python:PythonBackend",
    "onnxruntime": "mini_triton.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorrt": "mini_triton.backends.tensorrt:TensorRTBackend",
    "pytorch": "mini_triton.backends.pytorch.backend:PyTorchBackend",
    "ensemble": "mini_triton.backends.ensemble:EnsembleBackend",
    "fil": "mini_triton.backends.fil:FilBackend",
    "openvino": "mini_triton.backends.openvino:OpenVinoBackend",
}

# The optional extra that brings a backend's libraries, named in the reason of a model
# whose backend cannot be imported.
_EXTRAS = {
    "onnxruntime": "onnx",
    "tensorrt": "tensorrt",
    "pytorch": "pytorch",
    "fil": "fil",
    "openvino": "openvino",
}


def known_backends() -> list[str]:
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[Backend]:
    """The Backend class for a config's `backend`; UNAVAILABLE when it cannot be had."""
    target = _BACKENDS.get(name)
    if target is None:
        raise unavailable(
            f"unable to find backend library for backend '{name}', try specifying runtime "
            f"on the model configuration. Known backends: {', '.join(known_backends())}"
        )
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise unavailable(f"backend '{name}' is not installed: {error}{_install_hint(name)}"
                          ) from error
    return getattr(module, class_name)


def _install_hint(name: str) -> str:
    extra = _EXTRAS.get(name)
    return f" (pip install 'mini-triton[{extra}]')" if extra else ""

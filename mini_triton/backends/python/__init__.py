"""The Python backend (`backend: "python"`): NVIDIA Triton Python models, unchanged.

Importing this package makes `import triton_python_backend_utils` work (it is
`mini_triton.backends.python.utils` under Triton's name). The server-side
backend is imported on first use, so a model's worker process, which imports
this package too, stays light.
"""

from __future__ import annotations

from .runner import install_module_alias

install_module_alias()

__all__ = ["PythonBackend"]


def __getattr__(name: str):
    if name == "PythonBackend":
        from .backend import PythonBackend

        return PythonBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

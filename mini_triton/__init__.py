"""mini_triton: a Triton-compatible model-repository inference server in Python."""

__version__ = "0.1.0"
SERVER_NAME = "mini_triton"

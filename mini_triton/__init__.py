"""mini_triton: a Triton-compatible model-repository inference server in Python."""

import pathlib

# This package's folder, links resolved: the one definition for what needs our own
# files (a worker's PYTHONPATH, the grammar, tracebacks that hide our frames). Here,
# because every process of ours imports this module first and nothing else with it.
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent

__version__ = "0.1.0"
SERVER_NAME = "mini_triton"

# What the server metadata API answers (GET /v2, gRPC ServerMetadata): the name and
# version of the Triton release whose behaviour we match, because clients and tools
# key on them (NVIDIA's example clients stop unless the name is "triton"). Our own
# name and version are in `mini-triton --version`, the start-up log and the HTTP
# `Server` header.
TRITON_NAME = "triton"
TRITON_VERSION = "2.51.0"

"""mini_triton: a Triton-compatible model-repository inference server in Python."""

__version__ = "0.1.0"
SERVER_NAME = "mini_triton"

# What the server metadata API answers (GET /v2, gRPC ServerMetadata): the name and
# version of the Triton release whose behaviour we match, because clients and tools
# key on them (NVIDIA's example clients stop unless the name is "triton"). Our own
# name and version are in `mini-triton --version`, the start-up log and the HTTP
# `Server` header.
TRITON_NAME = "triton"
TRITON_VERSION = "2.51.0"

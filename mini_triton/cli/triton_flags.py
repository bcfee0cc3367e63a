"""Every flag of tritonserver 2.51, in the groups of its `--help`, and what each one
does here.

A deployment file written for tritonserver must start this server unchanged, so
every one of its flags is accepted. A flag is one of:

- honoured: it does here what it does in Triton (cli/main.py defines it);
- not applicable: it only means something on a GPU or inside Triton's C++ runtime
  (memory pools, thread pools of its HTTP library, shared-library directories); it is
  accepted and named once in the start-up log;
- not yet honoured: it has a meaning on a CPU server that this server does not
  implement yet; it is accepted and named in a start-up warning, never silently.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..config.coverage import NOT_APPLICABLE
from .flag_types import boolean
NOT_YET = "not yet honoured"

# tritonserver --help's groups, in its order ("" is the global group with --help).
GROUPS = ("", "Server", "Logging", "Model Repository", "HTTP", "GRPC", "Sagemaker", "Vertex",
          "Metrics", "Tracing", "Backend", "Repository Agent", "Response Cache",
          "Rate Limiter", "Memory/Device Management", "DEPRECATED")


@dataclass(frozen=True)
class TritonFlag:
    name: str
    group: str
    argument: str  # "bool", "int", "float", "string", "none", or a form like "<a>:<b>"
    repeatable: bool = False


def _flags(group: str, *specs: str) -> list[TritonFlag]:
    """`name:argument[*]` specs of one group; `*` marks a repeatable flag."""
    flags = []
    for spec in specs:
        name, _, argument = spec.partition(":")
        repeatable = argument.endswith("*")
        flags.append(TritonFlag(name, group, argument.rstrip("*"), repeatable))
    return flags


TRITON_FLAGS: tuple[TritonFlag, ...] = tuple(
    _flags("", "help:none")
    + _flags("Server", "id:string", "exit-timeout-secs:int")
    + _flags("Logging", "log-verbose:int", "log-info:bool", "log-warning:bool",
             "log-error:bool", "log-format:string", "log-file:string")
    + _flags("Model Repository", "model-store:string*", "model-repository:string*",
             "exit-on-error:bool", "disable-auto-complete-config:none",
             "strict-readiness:bool", "model-control-mode:string", "repository-poll-secs:int",
             "load-model:string*", "model-config-name:string", "model-load-thread-count:int",
             "model-load-retry-count:int", "model-namespacing:bool", "enable-peer-access:bool")
    + _flags("HTTP", "allow-http:bool", "http-address:string", "http-port:int",
             "reuse-http-port:bool", "http-header-forward-pattern:string",
             "http-thread-count:int", "http-restricted-api:<string>:<string>=<string>*")
    + _flags("GRPC", "allow-grpc:bool", "grpc-address:string", "grpc-port:int",
             "reuse-grpc-port:bool", "grpc-header-forward-pattern:string",
             "grpc-infer-allocation-pool-size:int", "grpc-use-ssl:bool",
             "grpc-use-ssl-mutual:bool", "grpc-server-cert:string", "grpc-server-key:string",
             "grpc-root-cert:string", "grpc-infer-response-compression-level:string",
             "grpc-keepalive-time:int", "grpc-keepalive-timeout:int",
             "grpc-keepalive-permit-without-calls:bool", "grpc-http2-max-pings-without-data:int",
             "grpc-http2-min-recv-ping-interval-without-data:int",
             "grpc-http2-max-ping-strikes:int", "grpc-max-connection-age:int",
             "grpc-max-connection-age-grace:int",
             "grpc-restricted-protocol:<string>:<string>=<string>*")
    + _flags("Sagemaker", "allow-sagemaker:bool", "sagemaker-port:int",
             "sagemaker-safe-port-range:<integer>-<integer>", "sagemaker-thread-count:int")
    + _flags("Vertex", "allow-vertex-ai:bool", "vertex-ai-port:int",
             "vertex-ai-thread-count:int", "vertex-ai-default-model:string")
    + _flags("Metrics", "allow-metrics:bool", "allow-gpu-metrics:bool", "allow-cpu-metrics:bool",
             "metrics-address:string", "metrics-port:int", "metrics-interval-ms:float",
             "metrics-config:<string>=<string>*")
    + _flags("Tracing", "trace-config:<string>,<string>=<string>*")
    + _flags("Backend", "backend-directory:string",
             "backend-config:<string>,<string>=<string>*")
    + _flags("Repository Agent", "repoagent-directory:string")
    + _flags("Response Cache", "cache-config:<string>,<string>=<string>*",
             "cache-directory:string")
    + _flags("Rate Limiter", "rate-limit:string",
             "rate-limit-resource:<string>:<integer>:<integer>*")
    + _flags("Memory/Device Management", "pinned-memory-pool-byte-size:int",
             "cuda-memory-pool-byte-size:<integer>:<integer>*",
             "cuda-virtual-address-size:<integer>:<integer>*",
             "min-supported-compute-capability:float", "buffer-manager-thread-count:int",
             "host-policy:<string>,<string>=<string>*", "model-load-gpu-limit:<device_id>:<fraction>*")
    + _flags("DEPRECATED", "strict-model-config:bool", "response-cache-byte-size:int",
             "trace-file:string", "trace-level:string*", "trace-rate:int", "trace-count:int",
             "trace-log-frequency:int")
)

# Why each flag that cli/main.py does not honour is only accepted. A flag missing both
# here and from cli/main.py fails the test that walks TRITON_FLAGS.
NOT_HONOURED: dict[str, tuple[str, str]] = {
    "enable-peer-access": (NOT_APPLICABLE, "CUDA peer access between GPUs"),
    "http-thread-count": (NOT_APPLICABLE, "HTTP is served by the event loop, not a thread pool"),
    "grpc-infer-allocation-pool-size": (NOT_APPLICABLE, "a C++ allocation pool of Triton's"),
    "allow-gpu-metrics": (NOT_APPLICABLE, "no GPU metrics on a CPU server"),
    "pinned-memory-pool-byte-size": (NOT_APPLICABLE, "CUDA pinned memory; only its size is "
                                     "reported, as nv_pinned_memory_pool_total_bytes, as Triton "
                                     "does"),
    "cuda-memory-pool-byte-size": (NOT_APPLICABLE, "CUDA memory"),
    "cuda-virtual-address-size": (NOT_APPLICABLE, "CUDA memory"),
    "min-supported-compute-capability": (NOT_APPLICABLE, "GPU compute capability"),
    "buffer-manager-thread-count": (NOT_APPLICABLE, "a thread pool of Triton's C++ core"),
    "host-policy": (NOT_APPLICABLE, "NUMA and CPU pinning of Triton's C++ threads"),
    "model-load-gpu-limit": (NOT_APPLICABLE, "GPU memory"),
    "backend-directory": (NOT_APPLICABLE, "backends are built in (identity, python, "
                          "onnxruntime, tensorrt); no shared libraries are loaded"),
    "repoagent-directory": (NOT_APPLICABLE, "repository agents are shared libraries"),
    "cache-directory": (NOT_APPLICABLE, "caches are built in (local); no shared libraries"),
    "sagemaker-thread-count": (NOT_APPLICABLE, "a thread pool of Triton's HTTP library; "
                               "the event loop serves the SageMaker port"),
    "vertex-ai-thread-count": (NOT_APPLICABLE, "a thread pool of Triton's HTTP library; "
                               "the event loop serves the Vertex AI port"),
}

BY_NAME = {flag.name: flag for flag in TRITON_FLAGS}


# --- the command line ---

OWN_GROUP = "mini_triton (not tritonserver flags)"


def grouped_adder(parser):
    """`add_argument` that files each flag under its tritonserver --help group (flags of
    our own under OWN_GROUP), so `--help` reads like tritonserver's."""
    groups = {name: parser.add_argument_group(f"{name or 'General'} options")
              for name in GROUPS}
    own = parser.add_argument_group(OWN_GROUP)

    def add(*names: str, **options):
        flag = BY_NAME.get(names[0].lstrip("-"))
        group = groups[flag.group] if flag is not None else own
        return group.add_argument(*names, **options)

    add.groups = groups
    return add


def _accepted_value(argument: str):
    """The parser of an accepted flag's value: checked as tritonserver checks it."""
    def number(kind):
        def parse(value: str):
            try:
                return kind(value)
            except ValueError:
                raise _argument_error(f"expected {'an integer' if kind is int else 'a number'}"
                                      f", got '{value}'") from None
        return parse

    if argument == "int":
        return number(int)
    if argument == "float":
        return number(float)
    if argument == "bool":
        return boolean
    return str


def _argument_error(message: str):
    return argparse.ArgumentTypeError(message)


def add_accepted_flags(parser, add) -> None:
    """Every tritonserver flag that the parser does not define yet, accepted with the
    reason it is not honoured (NOT_HONOURED) in its help."""
    known = {option for action in parser._actions for option in action.option_strings}
    for flag in TRITON_FLAGS:
        option = f"--{flag.name}"
        if option in known:
            continue
        status, reason = NOT_HONOURED[flag.name]
        options = {"dest": accepted_dest(flag.name), "default": None,
                   "help": f"accepted; {status} here: {reason}"}
        if flag.argument == "none":
            options["action"] = "store_true"
        else:
            options["type"] = _accepted_value(flag.argument)
            options["metavar"] = flag.argument.upper() if flag.argument.isalpha() \
                else flag.argument
            if flag.repeatable:
                options["action"] = "append"
        add(option, **options)


def accepted_dest(name: str) -> str:
    return "accepted_" + name.replace("-", "_")


def accepted_flags_given(args) -> list[tuple[str, str, str]]:
    """(flag, status, reason) for each accepted-only flag on the command line."""
    given = []
    for name, (status, reason) in NOT_HONOURED.items():
        value = getattr(args, accepted_dest(name), None)
        if value is not None and value is not False:
            given.append((f"--{name}", status, reason))
    return given


def status_rows(parser) -> list[tuple[str, str, str, str]]:
    """(group, flag, status, note) for every tritonserver flag, for the migration
    page: honoured flags carry their help text, the others why they are not."""
    helps = {option: action.help or "" for action in parser._actions
             for option in action.option_strings}
    rows = []
    for flag in TRITON_FLAGS:
        if flag.name in NOT_HONOURED:
            status, reason = NOT_HONOURED[flag.name]
            rows.append((flag.group or "General", f"--{flag.name}", status, reason))
        else:
            rows.append((flag.group or "General", f"--{flag.name}", "honoured",
                         helps.get(f"--{flag.name}", "")))
    return rows


def markdown_table(parser) -> str:
    lines = ["| group | flag | here | note |", "|---|---|---|---|"]
    for group, flag, status, note in status_rows(parser):
        lines.append(f"| {group} | `{flag}` | {status} | {note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"

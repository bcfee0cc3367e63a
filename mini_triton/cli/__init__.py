"""The command line, on top of the house: nothing of ours imports it but `__main__`.

- main.py: `mini-triton`'s parser, its settings and `main` (the server, or a subcommand);
- check_config.py: the `check-config` subcommand, which reads configs with the loader's
  own code (repository/, backends/);
- triton_flags.py: every tritonserver 2.51 flag and what it does here;
- flag_types.py: argparse types shared by every flag module;
- endpoint_flags.py, bound_flags.py, grpc_flags.py: the SageMaker/Vertex AI endpoints'
  flags, the bounds on connections and queued bytes, and the gRPC front end's own flags
  (HTTP/2 limits, keepalive, stream queues, compression);
- process_flags.py: --frontend-processes and the bound the descriptor limit puts on it.
"""

from .main import build_parser, configure_logging, main, settings_from

__all__ = ["build_parser", "configure_logging", "main", "settings_from"]

"""`mini-triton check-config PATH...`: read model configs as the server would, and say so.

Each config that reads is printed to stdout as JSON exactly as parsed (field names as in
the proto, nothing filled in), one document per file in argument order (`jq` reads them as
a stream). Each one that does not is reported on stderr as `PATH:LINE:COLUMN: message`.
The exit status is 2 when any file fails, 0 otherwise.
"""

from __future__ import annotations

import json
import os
import sys

from . import ConfigError, parse_config_file
from .json_format import config_to_json

USAGE = "usage: mini-triton check-config PATH... (a config.pbtxt, or a model directory)"


def main(paths: list[str]) -> int:
    """Check each path; returns the exit status."""
    if not paths or paths[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if paths else sys.stderr)
        return 0 if paths else 2
    failed = False
    try:
        for path in paths:
            failed |= not check_one(path)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as command-line tools do, with
        # stdout pointed at /dev/null so that Python's own final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 2 if failed else 0


def check_one(path: str) -> bool:
    """Print one config as JSON, or its error; True if it read."""
    config_path = os.path.join(path, "config.pbtxt") if os.path.isdir(path) else path
    try:
        config = parse_config_file(config_path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return False
    except OSError as error:
        print(f"{config_path}: cannot read: {error.strerror or error}", file=sys.stderr)
        return False
    document = config_to_json(config, including_defaults=False)
    print(json.dumps(document, indent=2, ensure_ascii=False))
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

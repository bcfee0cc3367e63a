"""A model's worker process: started connected to the server by a socket pair (with the
server's interpreter or in the model's own execution environment), stopped, and run
once for `auto_complete_config`; and how its exit is described in errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ... import PACKAGE_DIR
from ...core.errors import internal
from .exec_env import ExecutionEnvironment
from .messages import AUTO_COMPLETE
from ...core.link.wire import Link

WORKER_MODULE = "mini_triton.backends.python.worker"
_PACKAGE_ROOT = str(PACKAGE_DIR.parent)  # the folder that holds mini_triton/


@dataclass(eq=False)
class Worker:
    """One worker process of an instance, and how far it got."""

    process: subprocess.Popen
    link: Link
    serving: bool = False  # its model initialized: its death takes the instance down
    gone: bool = False  # its link closed
    reader: threading.Thread | None = None  # where no event loop reads its messages


def spawn(label: str, environment: ExecutionEnvironment | None = None
          ) -> tuple[subprocess.Popen, Link]:
    """Start a worker process connected to us by a socket pair, with the server's
    interpreter or in the model's own execution environment."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    arguments = ["-m", WORKER_MODULE, str(child.fileno()), label]
    if environment is None:
        command, env = [sys.executable, *arguments], dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH"))
                                            if p)
    else:
        command, env = environment.command(arguments), environment.variables(dict(os.environ))
    # The worker inherits the server's hold on an unpacked environment: while it runs,
    # the copy it runs from is not pruned, whatever the server lets go of meanwhile.
    inherited = environment.inherited_fds if environment is not None else ()
    try:
        process = subprocess.Popen(command, pass_fds=(child.fileno(), *inherited),
                                   stdin=subprocess.DEVNULL, env=env)
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    return process, Link(parent)


def stop_process(process: subprocess.Popen, link: Link, grace_s: float = 2.0) -> None:
    """Close the link (the worker exits on it) and reap the process, killing it if it lingers."""
    link.close()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def auto_complete(model_file: Path, config_json: str, model_name: str,
                  environment: ExecutionEnvironment | None = None) -> str:
    """Run the model's `auto_complete_config` in a short-lived worker; the completed JSON.
    Its errors name the model (`model_name`), as Triton's do."""
    label = f"{model_name}_auto_complete"
    process, link = spawn(label, environment)
    try:
        link.send({"op": AUTO_COMPLETE, "model_file": str(model_file), "label": model_name,
                   "config": config_json})
        reply = link.recv().meta
    except (EOFError, OSError):
        raise internal(f"the worker process for '{label}' {exit_description(process)} while "
                       "running auto_complete_config") from None
    finally:
        stop_process(process, link)
    if reply.get("error"):
        raise internal(reply["error"])
    return reply["config"]


def exit_description(process: subprocess.Popen) -> str:
    try:
        code = process.wait(5)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by signal {name}"
    return f"exited with status {code}"

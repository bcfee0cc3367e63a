"""Every command in README.md and docs/*.md that is marked runnable runs as written.

A fenced block is runnable when its info string says so:

    ```bash runnable          a shell block, run with `bash -e -o pipefail`
    ```python runnable        a Python block, run with this interpreter
    ```bash runnable server   one `mini-triton ...` command that runs in the foreground:
                              the test starts it (tests/serverproc.py) and runs the
                              page's later blocks against it, until the next server
                              block or the end of the page
    ```bash runnable needs-gpu      not run: needs a CUDA device (syntax checked only)
    ```bash runnable needs-docker   not run: needs a container engine or a cluster
                                    (syntax checked only)

The rules the test runs them by:

- The blocks of one page run in order, in a fresh folder per page that holds a copy of
  `model_repository/` and links to every other top-level entry of the checkout, so
  paths read as they do in a checkout and a block may create files of its own.
- `python`, `python3` and `mini-triton` on PATH are this interpreter and this tree's
  server (`python -m mini_triton`).
- Until a page's first server block, its blocks talk to one server the test starts on
  the bundled `model_repository/`: the documented command
  `mini-triton --model-repository model_repository`.
- Ports: the documented ports are replaced by the real ones. Wherever a block says
  `localhost:8000`, `localhost:8001` or `localhost:8002` (or the same with `127.0.0.1`),
  the port becomes the port the server bound for HTTP, gRPC or metrics (so a runnable
  block spells out the address where a client would default to it). A server block
  is started with `--http-port=0 --grpc-port=0 --metrics-port=0` and loopback addresses
  appended (they win over the block's own), and its relative paths are resolved in the
  page's folder.
- A block passes when it exits with status 0 within BLOCK_TIMEOUT seconds.

Only quick blocks are marked (curl, tritonclient snippets, check-config, --help): the
whole file runs in well under a minute. The install commands are not marked.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from serverproc import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT = 60
KNOWN_WORDS = {"runnable", "server", "needs-gpu", "needs-docker"}
SKIP_REASONS = {"needs-gpu": "needs a CUDA device", "needs-docker": "needs a container engine"}
SHELLS = {"bash", "sh", "shell"}
LOOPBACK = ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1", "--exit-timeout-secs=5"]
DEFAULT_SERVER = "mini-triton --model-repository model_repository"
DOCUMENTED_PORTS = {"8000": "http", "8001": "grpc", "8002": "metrics"}
PORT_PATTERN = re.compile(r"\b(localhost|127\.0\.0\.1):(8000|8001|8002)\b")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^`\n]*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    words: frozenset
    text: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return "runnable" in self.words

    @property
    def skip_reason(self) -> str | None:
        return next((SKIP_REASONS[w] for w in sorted(self.words) if w in SKIP_REASONS), None)


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with its info string split in words."""
    blocks, lines = [], page.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, indent = match["fence"], len(match["indent"])
        info = match["info"].split()
        body, start = [], index + 1
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else
                        lines[index])
            index += 1
        index += 1
        language = info[0] if info else ""
        blocks.append(Block(page, start, language, frozenset(info[1:]), "\n".join(body) + "\n"))
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
RUNNABLE = [block for block in ALL_BLOCKS if block.runnable]
PAGES_TO_RUN = [page for page in PAGES
                if any(b.page == page and not b.skip_reason for b in RUNNABLE)]


def with_ports(text: str, ports: dict[str, int]) -> str:
    """The block with each documented port replaced by the one the server bound."""
    return PORT_PATTERN.sub(
        lambda m: f"{m[1]}:{ports[DOCUMENTED_PORTS[m[2]]]}", text)


def server_arguments(block_text: str, folder: Path) -> list[str]:
    """A server block's flags, relative paths resolved in the page's folder."""
    words = shlex.split(block_text.replace("\\\n", " "), comments=True)
    if words[:1] == ["mini-triton"]:
        words = words[1:]
    elif words[:3] in (["python", "-m", "mini_triton"], ["python3", "-m", "mini_triton"]):
        words = words[3:]
    else:
        raise AssertionError(f"a server block is one mini-triton command, got {block_text!r}")

    def resolved(word: str) -> str:
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("--"):
            return f"{flag}={resolved(value)}"
        if word and not word.startswith("-") and (folder / word).exists():
            return str(folder / word)
        return word

    return [resolved(word) for word in words]


def start_server(block_text: str, folder: Path) -> ServerProcess:
    args = server_arguments(block_text, folder)
    server = ServerProcess([*args, "--http-port=0", "--grpc-port=0", "--metrics-port=0",
                            *LOOPBACK]).start()
    # Ready means HTTP and gRPC are up; the metrics port may be logged a moment later.
    deadline = time.monotonic() + 30
    while "metrics" not in server.ports and time.monotonic() < deadline:
        time.sleep(0.05)
    return server


def page_folder(tmp_path: Path) -> Path:
    """A folder that reads like the checkout: model_repository/ copied, the rest linked."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", "model_repository"} or entry.name.startswith("."):
            continue
        (folder / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "model_repository", folder / "model_repository",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def tool_folder(tmp_path: Path) -> Path:
    """`python`, `python3` and `mini-triton` as this interpreter and this tree."""
    tools = tmp_path / "bin"
    tools.mkdir()
    python = shlex.quote(sys.executable)  # a link would lose the virtualenv
    for name, command in [("python", python), ("python3", python),
                          ("mini-triton", f"{python} -m mini_triton")]:
        script = tools / name
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        script.chmod(0o755)
    return tools


def run_block(block: Block, text: str, folder: Path, env: dict) -> subprocess.CompletedProcess:
    if block.language in SHELLS:
        command = ["bash", "-e", "-o", "pipefail", "-c", text]
    elif block.language == "python":
        command = [sys.executable, "-c", text]
    else:
        raise AssertionError(f"{block.name}: cannot run a '{block.language}' block")
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT)


@pytest.fixture(scope="module")
def bundled_server():
    """The documented server on the bundled model repository, shared by every page."""
    server = start_server(DEFAULT_SERVER, ROOT)
    yield server
    server.stop()


@pytest.mark.parametrize("page", PAGES_TO_RUN, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run_as_written(page, bundled_server, tmp_path):
    folder, tools = page_folder(tmp_path), tool_folder(tmp_path)
    env = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    server, own_server = bundled_server, None
    try:
        for block in (b for b in RUNNABLE if b.page == page and not b.skip_reason):
            if "server" in block.words:
                if own_server is not None:
                    own_server.stop()
                    own_server = None
                if server_arguments(block.text, ROOT) == server_arguments(DEFAULT_SERVER, ROOT):
                    server = bundled_server  # the same command: the same server
                else:
                    own_server = server = start_server(block.text, folder)
                continue
            result = run_block(block, with_ports(block.text, server.ports), folder, env)
            assert result.returncode == 0, (
                f"{block.name} exited with status {result.returncode}\n--- block\n"
                f"{block.text}--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
                f"--- server\n{server.output[-4000:]}")
    finally:
        if own_server is not None:
            own_server.stop()


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.skip_reason],
                         ids=lambda b: b.name)
def test_blocks_that_need_a_gpu_or_docker_are_well_formed(block):
    """Not run here; the shell must parse them and Python must compile them."""
    if block.language in SHELLS:
        result = subprocess.run(["bash", "-n", "-c", block.text], capture_output=True,
                                text=True)
        assert result.returncode == 0, f"{block.name}: {result.stderr}"
    else:
        ast.parse(block.text, block.name)
    pytest.skip(f"{block.name} {block.skip_reason}: checked for syntax only")


def test_every_marking_is_known():
    """A typo in an info string (`runable`, `need-gpu`) would silently drop a block."""
    for block in ALL_BLOCKS:
        words = set(block.words)
        if words & KNOWN_WORDS or any("run" in w or "need" in w for w in words):
            assert words <= KNOWN_WORDS, f"{block.name}: unknown words {words - KNOWN_WORDS}"
            assert "runnable" in words, f"{block.name}: {sorted(words)} without 'runnable'"
            assert block.language in SHELLS | {"python"}, f"{block.name}: {block.language}"
        if "server" in words:
            server_arguments(block.text, ROOT)  # one mini-triton command


def test_there_is_something_to_run():
    assert len(RUNNABLE) >= 20
    assert {b.language for b in RUNNABLE} >= {"bash", "python"}

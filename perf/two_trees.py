"""The A/B harness of the in-process connection benchmarks (bench_http_connection.py,
bench_grpc_connection.py): a round, Python source run with `python -c` inside one source
tree, is run in the "before" and "after" trees alternately, each in its own process, and
the µs and bytecodes per unit of work of every round are printed as a table, then the best
time of each tree.

A round prints `[µs per unit, bytecodes per unit]` as JSON on its last line. It may begin
with ROUND_PRELUDE, which gives it a transport that keeps nothing and a bytecode counter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Source, not an import: a round runs inside a tree that may predate this module.
ROUND_PRELUDE = r"""
import sys


class NullTransport:
    '''An asyncio transport that keeps nothing and never pushes back.'''
    def write(self, data): pass
    def writelines(self, chunks): pass
    def is_closing(self): return False
    def close(self): pass
    def abort(self): pass
    def get_write_buffer_size(self): return 0
    def set_write_buffer_limits(self, high=None, low=None): pass
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_extra_info(self, name, default=None): return default


def count_bytecodes(feed, items) -> int:
    '''Python bytecodes executed by feed(item) for each item, in all.'''
    return sum(count_by_function(feed, items).values())


def count_by_function(feed, items):
    '''Python bytecodes executed by feed(item) for all items, by file:function (opcode
    tracing; the loop here is not counted: this frame began before the tracer was set).'''
    import collections, os
    counts = collections.Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        return tracer

    sys.settrace(tracer)
    for item in items:
        feed(item)
    sys.settrace(None)
    return counts


def start_identity_server(loop, config):
    '''An in-process Server, no listeners, whose repository holds identity_py with
    `config` (the whole inference path, its front end fed by hand).'''
    import os, tempfile
    from mini_triton.server import Server, Settings
    repository = tempfile.mkdtemp()
    os.makedirs(os.path.join(repository, "identity_py", "1"))
    with open(os.path.join(repository, "identity_py", "config.pbtxt"), "w") as file:
        file.write(config)
    server = Server(Settings(model_repositories=[repository], allow_http=False,
                             allow_grpc=False, allow_metrics=False))
    loop.run_until_complete(server.start())
    return server


def run_off_the_main_thread(main):
    '''main(count, by_function) from the command line, on a thread: on the main thread
    each run_until_complete would set up uvloop's signal handling (a socketpair) again,
    which a server's one long run does not do.'''
    import threading
    thread = threading.Thread(target=main, args=(int(sys.argv[1]), sys.argv[2] == "1"))
    thread.start()
    thread.join()
"""


def one_round(tree: Path, round_source: str, arguments: list[str]) -> tuple[float, float]:
    """Runs `round_source` in `tree` (its own PYTHONPATH) and returns its (µs, bytecodes)."""
    done = subprocess.run([sys.executable, "-c", round_source, *arguments], cwd=tree,
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    return tuple(json.loads(done.stdout))


def compare_trees(round_source: str, arguments: list[str], unit: str,
                  args: argparse.Namespace) -> int:
    """Runs `args.rounds` rounds in `args.trees` (before, after) alternately, printing a
    table row per round and the best of each tree; `unit` names what one figure is per."""
    before, after = (tree.resolve() for tree in args.trees)
    results: dict[Path, list[tuple[float, float]]] = {before: [], after: []}
    print(f"| round | before µs/{unit} | after µs/{unit} | before bytecodes/{unit} | "
          f"after bytecodes/{unit} |\n|---|---|---|---|---|")
    for number in range(1, args.rounds + 1):
        order = [before, after] if number % 2 else [after, before]
        for tree in order:
            results[tree].append(one_round(tree, round_source, arguments))
        (b_us, b_ops), (a_us, a_ops) = results[before][-1], results[after][-1]
        print(f"| {number} | {b_us:.2f} | {a_us:.2f} | {b_ops:,.0f} | {a_ops:,.0f} |",
              flush=True)
    best_before = min(us for us, _ in results[before])
    best_after = min(us for us, _ in results[after])
    print(f"\nbest: before {best_before:.2f} µs, after {best_after:.2f} µs "
          f"({best_after - best_before:+.2f} µs, {best_after / best_before:.3f}x)")
    return 0


def tree_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the two trees and --rounds; a benchmark adds its own counts."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("trees", nargs=2, type=Path, help="before and after source trees")
    parser.add_argument("--rounds", type=int, default=5)
    return parser


def whole_path_main(description: str, round_source: str, unit: str) -> int:
    """The command line of a whole-path benchmark (bench_http_infer_path.py,
    bench_grpc_infer_path.py): two trees alternately, or with --by-function the after
    tree's bytecodes per `unit` by function."""
    parser = tree_arguments(description)
    parser.add_argument("--count", type=int, default=20000, help=f"{unit}s per round")
    parser.add_argument("--by-function", action="store_true",
                        help=f"bytecodes per {unit} of each function, in the after tree")
    args = parser.parse_args()
    if args.by_function:
        tree = args.trees[1].resolve()
        subprocess.run([sys.executable, "-c", round_source, "0", "1"], cwd=tree, check=True,
                       env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
        return 0
    return compare_trees(round_source, [str(args.count), "0"], unit, args)

#!/usr/bin/env python3
"""Python bytecodes per request in mini_triton/scheduling for the loop-driven dynamic
batcher (the one a process-mode Python model gets), counted in process and exactly:
no server, no load, the same figure on every run.

Two ways a request goes, as at concurrency 2 on one instance:
- queued: the instance is busy; the request waits, and the batch that ends hands it
  out (submit, queue, take, begin, end, answer); also with 4 requests a batch, as
  at higher concurrency;
- immediate: the instance is idle and nothing is queued; the request starts at once.

    python perf/sched_counts.py .                    # this tree
    python perf/sched_counts.py /tmp/before --top 30 # another tree, by function

Counted: the functions in mini_triton/scheduling and the dataclass __init__s they
run; the instance is a stand-in that only records the batch and, when told, answers
it and ends it with answers made beforehand (its own code is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
from pathlib import Path

REQUESTS = 500
CONFIG = ('name: "m" max_batch_size: 8 backend: "python" dynamic_batching { } '
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ] '
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]')


class StandInInstance:
    """Loop-driven like a process-mode Python instance: `begin` records the batch,
    `finish` answers and ends it."""

    loop_driven = True
    responds_in_execute = False
    reports_response_statistics = False

    def __init__(self, loop, answers: dict, timing):
        self.loop = loop
        self.begun: list = []
        self.answers, self.timing = answers, timing  # made before counting starts

    def begin(self, batch: list, on_end, light: bool = False) -> None:
        self.begun.append((batch, on_end))

    def finish(self, index: int) -> None:
        batch, on_end = self.begun[index]
        for request in batch:
            request.respond(self.answers[request.id])
        on_end(self.timing)

    def finalize(self) -> None:
        pass


def count(tree: Path, top: int) -> None:
    sys.path.insert(0, str(tree.resolve()))
    import numpy as np
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    import mini_triton
    from mini_triton.core.request import InferenceRequest, InferenceResponse
    from mini_triton.core.stats import ExecutionTiming, ModelStats
    from mini_triton.core.tensor import Tensor
    from mini_triton.scheduling.loop_driven import LoopScheduler

    print(f"{Path(mini_triton.__file__).parent.parent}:")
    counts: collections.Counter = collections.Counter()

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call":
            if "mini_triton/scheduling" not in code.co_filename and code.co_filename != "<string>":
                return None
            frame.f_trace_opcodes = True
        elif event == "opcode":
            name = code.co_name
            if code.co_filename == "<string>":  # a dataclass's generated __init__
                name = f"{type(frame.f_locals.get('self')).__name__}.{name}"
            counts[f"{os.path.basename(code.co_filename)}:{name}"] += 1
        return tracer

    def request(number: int):
        data = np.zeros((1, 16), np.float32)
        return InferenceRequest("m", "1", str(number), [Tensor("INPUT0", "FP32", (1, 16), data)],
                                batch_size=1)

    async def run(queued: bool, per_batch: int = 1) -> None:
        loop = asyncio.get_running_loop()
        requests = [request(n) for n in range(REQUESTS + 1)]
        answers = {r.id: InferenceResponse("m", "1", r.id, []) for r in requests}
        instance = StandInInstance(loop, answers, ExecutionTiming(0, 0, 0, 0))
        scheduler = LoopScheduler(text_format.Parse(CONFIG, mc.ModelConfig()), [instance],
                                  ModelStats("m", "1"), loop)
        for r in requests:
            r.deliver = lambda response: None  # the frontend's delivery, not counted
        if queued:
            scheduler.submit(requests[0])  # the instance is busy from here on
        sys.settrace(tracer)
        for n in range(1, REQUESTS + 1):
            scheduler.submit(requests[n])
            if n % per_batch == 0:  # the batch running ends: what queued goes as one
                instance.finish(len(instance.begun) - 1)
        sys.settrace(None)
        assert scheduler.inflight() == (per_batch if queued else 0)
        way = f"queued, {per_batch} a batch" if queued else "immediate"
        print(f"  {way}: {sum(counts.values()) / REQUESTS:,.1f} bytecodes per request")
        for name, value in counts.most_common(top):
            print(f"    {value / REQUESTS:7.1f}  {name}")
        counts.clear()

    asyncio.run(run(True))
    asyncio.run(run(True, 4))
    asyncio.run(run(False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="source tree to count")
    parser.add_argument("--top", type=int, default=0, help="functions listed per way")
    args = parser.parse_args()
    count(args.tree, args.top)


if __name__ == "__main__":
    main()

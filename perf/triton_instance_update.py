#!/usr/bin/env python3
"""Instance-group updates on mini_triton and on the real Triton 2.51, one after the other,
with the same calls: what each server initializes and finalizes, when, and how long each
load takes.

    perf/setup_triton.sh                     # once: installs Triton 2.51 (perf/tritonserver)
    python perf/triton_instance_update.py    # prints both servers' answers and the differences

The model (tests/python_models.py's counting model) writes each initialize, execute and
finalize to a file, so the counts are what the model saw. The steps, on a server started in
explicit mode with 2 instances:

  1. a load with a config override asking for 3: which instances start;
  2. three requests of 1.5 s in flight, then a load asking for 1: which instances are
     finalized, whether after their request, which one is kept, how long the load takes;
  3. the statistics' success count (kept through an update);
  4. a load with the same override but no "name": a full reload on Triton;
  5. a load changing a parameter: a full reload, statistics anew;
  6. a sequence model (1 instance, then 2, then 1 with two sequences open): which
     instance serves each request, and when the removed one is finalized.

Load times are printed, not compared (they depend on the machine); everything else is
compared. Exit status 0 when the compared answers agree, 1 when not, 2 when a server did
not start.
"""

from __future__ import annotations

import json
import py_compile
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from compare import Server, free_port  # noqa: E402
from measurements import PERF_DIR  # noqa: E402
from python_models import (COUNTING_MODEL, COUNTING_SEQUENCE_MODEL,  # noqa: E402
                           counted_config_json, counted_config_pbtxt, counted_sequence_config)

SLOW_SECONDS = 1.5


def start(name: str, repository: Path, out_dir: Path) -> Server:
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    flags = ["--model-repository", str(repository), "--http-port", str(ports["http"]),
             "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
             "--model-control-mode", "explicit", "--load-model", "counted",
             "--exit-timeout-secs", "10"]
    command = ([str(PERF_DIR / "tritonserver"), *flags] if name == "triton"
               else [sys.executable, "-m", "mini_triton", *flags])
    server = Server(name, command, repository.parent / f"{name}.log", ports)
    server.start()
    server.wait_ready("counted", 120)
    return server


def events(path: Path) -> list[tuple[float, str, str]]:
    if not path.exists():
        return []
    return [(float(t), word, name) for t, word, name in
            (line.split() for line in path.read_text().splitlines())]


def changes(before: list, after: list) -> dict:
    """The instances initialized and finalized between two readings of the events."""
    new = after[len(before):]
    return {"initialized": sorted(n for _, w, n in new if w == "initialize"),
            "finalized": sorted(n for _, w, n in new if w == "finalize")}


def infer(url: str, seconds: float) -> float:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return float(client.infer("counted", [tensor]).as_numpy("OUTPUT0")[0])


def timed_load(client, config: dict) -> float:
    started = time.monotonic()
    client.load_model("counted", config=json.dumps(config))
    return round(time.monotonic() - started, 2)


def successes(client) -> int:
    stats = client.get_inference_statistics("counted")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def scenario(server: Server, log: Path) -> tuple[dict, dict]:
    """(compared answers, load times) of the steps above on one server."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    answers, times = {}, {}
    infer(server.http_url, 0.0)
    seen = events(log)
    times["2 -> 3"] = timed_load(client, counted_config_json(3, "process"))
    answers["2 -> 3"] = changes(seen, events(log))
    seen = events(log)
    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(infer, server.http_url, SLOW_SECONDS) for _ in range(3)]
        deadline = time.monotonic() + 30
        while sum(w == "execute-start" for _, w, _ in events(log)[len(seen):]) < 3 \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        times["3 -> 1, 3 requests in flight"] = timed_load(
            client, counted_config_json(1, "process"))
        answers["3 -> 1"] = changes(seen, events(log))
        answers["3 -> 1 requests"] = [request.result() for request in slow]
    ends = {n: t for t, w, n in events(log) if w == "execute-end"}
    answers["3 -> 1 finalized after their request"] = all(
        t >= ends.get(n, 0) for t, w, n in events(log)[len(seen):] if w == "finalize")
    answers["statistics kept: successes"] = successes(client)
    seen = events(log)
    unnamed = counted_config_json(1, "process")
    del unnamed["name"]
    times["same config, no name"] = timed_load(client, unnamed)
    answers["same config, no name"] = changes(seen, events(log))
    seen = events(log)
    times["a parameter changed"] = timed_load(
        client, counted_config_json(1, "process", label="changed"))
    answers["a parameter changed"] = changes(seen, events(log))
    answers["statistics after a reload: successes"] = successes(client)
    return answers, times


def sequence_step(client, corr: int, start: bool = False, end: bool = False) -> str:
    """One request of sequence `corr`: the instance that ran it."""
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0.0], dtype=np.float32))
    result = client.infer("counted", [tensor], sequence_id=corr, sequence_start=start,
                          sequence_end=end)
    return result.as_numpy("INSTANCE")[0].decode()


def sequence_scenario(server: Server, log: Path) -> tuple[dict, dict]:
    """A sequence model, 1 -> 2 -> 1 instances with two sequences open: which instance
    serves each request, and what is initialized and finalized when."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    answers, times = {"steps": []}, {}
    steps = answers["steps"]
    steps.append(("sequence 1 starts", sequence_step(client, 1, start=True)))
    times["sequence model 1 -> 2"] = timed_load(client, counted_sequence_config(2))
    steps.append(("sequence 2 starts", sequence_step(client, 2, start=True)))
    seen = events(log)
    times["sequence model 2 -> 1"] = timed_load(client, counted_sequence_config(1))
    answers["2 -> 1, two sequences open"] = changes(seen, events(log))
    steps.append(("sequence 1 goes on", sequence_step(client, 1)))
    steps.append(("sequence 2 ends", sequence_step(client, 2, end=True)))
    steps.append(("sequence 1 ends", sequence_step(client, 1, end=True)))
    deadline = time.monotonic() + 20
    while not changes(seen, events(log))["finalized"] and time.monotonic() < deadline:
        time.sleep(0.05)
    answers["after the sequences end"] = changes(seen, events(log))
    steps.append(("sequence 3", sequence_step(client, 3, start=True, end=True)))
    return answers, times


def model_folder(repository: Path, source: str, config: str) -> None:
    (repository / "counted" / "1").mkdir(parents=True)
    (repository / "counted" / "1" / "model.py").write_text(source)
    # Triton reloads a model whose version folder changed since it was loaded, and its
    # Python stub writes __pycache__ there on the first load: compiled beforehand, the
    # first update is not a full reload for that reason alone.
    py_compile.compile(str(repository / "counted" / "1" / "model.py"), doraise=True)
    (repository / "counted" / "config.pbtxt").write_text(config)


def run(name: str, out_dir: Path) -> tuple[dict, dict]:
    answers, times = {}, {}
    sequence_config = text_format.MessageToString(
        json_format.ParseDict(counted_sequence_config(1), mc.ModelConfig()))
    for label, source, config, steps in [
            ("plain", COUNTING_MODEL, counted_config_pbtxt(2, "process"), scenario),
            ("sequence", COUNTING_SEQUENCE_MODEL, sequence_config, sequence_scenario)]:
        repository = out_dir / name / label / "repo"
        model_folder(repository, source, config)
        server = start(name, repository, out_dir)
        try:
            more_answers, more_times = steps(server, repository.parent / "events.log")
        finally:
            server.stop()
        answers.update(more_answers)
        times.update(more_times)
    return answers, times


def main() -> int:
    out_dir = Path(tempfile.mkdtemp(prefix="instance-update-"))
    results = {}
    for name in ("triton", "mini_triton"):
        try:
            results[name] = run(name, out_dir)
        except RuntimeError as error:
            print(f"{name}: {error}")
            return 2
    differences = 0
    for step in results["triton"][0]:
        theirs, ours = results["triton"][0][step], results["mini_triton"][0].get(step)
        mark = "same" if theirs == ours else "DIFFERENT"
        differences += theirs != ours
        print(f"{step}: {mark}\n  triton:      {theirs}\n  mini_triton: {ours}")
    print("load seconds (triton / mini_triton):")
    for step, seconds in results["triton"][1].items():
        print(f"  {step}: {seconds} / {results['mini_triton'][1][step]}")
    print(f"{differences} difference(s); logs in {out_dir}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How mini_triton's throughput scales with --frontend-processes N, and why: 64 B FP32
requests to the Python echo over HTTP and gRPC under perf_analyzer, for N = 1, 2 and (where
the machine has the cores) 4 and 8, with the CPU each kind of process spends per inference
read from /proc: the main process (at N >= 2 the service, schedulers and model links, and
its side of the hop), the front-end processes (protocol work), the model's worker, and
perf_analyzer itself.

From those figures the scaling model (perf/README.md, "Front-end processes: the scaling
model") reads off a front-end process's throughput per core, what the hop costs the main
process per request, and the throughput at which the main process, the worker or the
machine's cores run out:

    X(N) = min(N * 1e6 / f, 1e6 / m, workers * 1e6 / w, cores * 1e6 / (m + f + w + k))

with f, m, w, k the front-end, main, worker and client CPU µs per inference (at N = 1 the
main process does the front end's work too: X(1) <= 1e6 / m(1)).

Every server is started once and kept up; at each point they are measured in turn, which
goes first turning from point to point, so the machine's drift touches all alike.
perf_analyzer's gRPC client opens one connection per concurrent context here (`--grpc-share
1`; its default shares one among up to several), so that the kernel can spread them over
the front-end processes; the connections each process held are counted from /proc.

    python perf/frontend_scaling.py                      # N = 1, 2 (4, 8 with the cores)
    python perf/frontend_scaling.py --counts 1,2,4,8 --concurrency 64 --rounds 3
    python perf/frontend_scaling.py --counts 1,2 --competition 2 -p 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
import compare_table  # noqa: E402
import competition  # noqa: E402
import process_cpu  # noqa: E402
from measurements import PERF_DIR, RESULTS_DIR, Measurement, save_json  # noqa: E402

ELEMENTS = 16  # FP32: 64 B, the request whose cost is all protocol and scheduling
COUNTS = (1, 2, 4, 8)
PREDICTED_COUNTS = (1, 2, 4, 8, 16)


@dataclass
class Costs:
    """One (N, protocol) point, medians of its rounds: throughput and the CPU µs per
    inference of each kind of process, the connections each front end held."""

    count: int
    protocol: str
    throughput: float
    main_us: float
    frontend_us: float
    worker_us: float
    client_us: float
    workers: int
    frontend_each_us: list[float]
    connections: list[int]

    def ceilings(self, count: int | None = None, cores: int | None = None) -> dict:
        """Inferences/s at which each part runs out, with these per-request costs and
        `count` front-end processes (default: as measured) on `cores` cores (default:
        this machine's). The main process and each front-end process are one event-loop
        thread each, so one core at most; at N = 1 the main process is the front end."""
        count = count or self.count
        cores = cores or os.cpu_count()
        serving_us = self.frontend_us if count > 1 else self.main_us
        total = self.main_us + self.frontend_us + self.worker_us + self.client_us
        return {"front ends": _rate(count, serving_us), "main": _rate(1, self.main_us),
                "workers": _rate(self.workers, self.worker_us), "cores": _rate(cores, total)}

    @property
    def main_busy(self) -> float:
        """Cores the main process used: near 1.0 it is the limit."""
        return self.throughput * self.main_us / 1e6


def _rate(cores: float, us_per_inference: float) -> float:
    """Inferences/s that `cores` cores give at this CPU per inference."""
    return cores * 1e6 / us_per_inference if us_per_inference else float("inf")


def costs_of(m: Measurement) -> Costs:
    extra = m.extra
    return Costs(
        count=int(m.server.rsplit("-n", 1)[1]), protocol=m.protocol,
        throughput=m.throughput, main_us=extra["cpu_us_main"],
        frontend_us=extra["cpu_us_frontend"], worker_us=extra["cpu_us_worker"],
        client_us=extra["client_cpu_us"], workers=extra["processes"]["worker"],
        frontend_each_us=extra["frontend_cpu_us_each"],
        connections=extra["connections"])


# ---------------------------------------------------------------------------- measuring


def measure_all(servers: list, args: argparse.Namespace, out_dir: Path) -> list[Measurement]:
    """Every (round, protocol) on every server in turn; with each measurement, in
    `extra["connections"]`, the client connections each serving process held."""
    results, turn = [], 0
    for number in range(1, args.rounds + 1):
        for protocol in args.protocols:
            point = compare_table.Point(ELEMENTS, protocol, args.concurrency)
            for server in compare_table.rotated(servers, turn):
                print(f"[scaling] round {number}: {server.name} {point.label()} ...",
                      file=sys.stderr, flush=True)
                ports = {server.ports["http"], server.ports["grpc"]}
                with process_cpu.ConnectionSampler(server.proc.pid, ports) as sampler:
                    m = compare_table.measure(server, args.model, point, args, out_dir)
                m.extra.update(round=number, connections=sampler.serving())
                print(f"[scaling]   {m.throughput:,.0f} infer/s, main "
                      f"{m.extra['cpu_us_main']:,.0f} / front ends "
                      f"{m.extra['cpu_us_frontend']:,.0f} / workers "
                      f"{m.extra['cpu_us_worker']:,.0f} us CPU per inference, connections "
                      f"{sampler.serving()} {m.note}", file=sys.stderr, flush=True)
                results.append(m)
            turn += 1
    return results


# ---------------------------------------------------------------------------- the model


def measured_table(points: list[Costs]) -> str:
    header = ["N", "protocol", "infer/s", "x N=1", "main us/inf", "front ends us/inf",
              "workers us/inf", "perf_analyzer us/inf", "main busy (cores)",
              "each front end us/inf", "connections per serving process"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    first = {p.protocol: p for p in points if p.count == min(q.count for q in points)}
    for p in points:
        lines.append("| " + " | ".join([
            str(p.count), p.protocol, f"{p.throughput:,.0f}",
            f"{p.throughput / first[p.protocol].throughput:.2f}",
            f"{p.main_us:,.0f}", f"{p.frontend_us:,.0f}", f"{p.worker_us:,.0f}",
            f"{p.client_us:,.0f}", f"{p.main_busy:.2f}",
            " ".join(f"{v:,.0f}" for v in p.frontend_each_us) or "-",
            " ".join(map(str, p.connections)) or "-"]) + " |")
    return "\n".join(lines)


def ceilings_table(points: list[Costs]) -> str:
    """Each part's ceiling at each point, and the one that binds."""
    parts = ("front ends", "main", "workers", "cores")
    header = ["N", "protocol", "infer/s"] + [f"{p} ceiling" for p in parts] + ["binds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in points:
        ceilings = p.ceilings()
        lines.append("| " + " | ".join(
            [str(p.count), p.protocol, f"{p.throughput:,.0f}"]
            + [f"{ceilings[part]:,.0f}" for part in parts]
            + [min(ceilings, key=ceilings.get)]) + " |")
    return "\n".join(lines)


def hop_lines(points: list[Costs]) -> list[str]:
    """What the hop costs: the main process's CPU per request at N >= 2 against N = 1
    (where it also did the protocol work), and the server's CPU outside the model."""
    ones = {p.protocol: p for p in points if p.count == 1}
    return [_hop_line(p, ones[p.protocol]) for p in points
            if p.count > 1 and p.protocol in ones]


def _hop_line(p: Costs, one: Costs) -> str:
    if not (p.frontend_us and one.main_us):
        return f"- {p.protocol} N={p.count}: no front-end CPU measured"
    split_us = p.main_us + p.frontend_us
    return (f"- {p.protocol} N={p.count}: main {p.main_us:,.0f} us/inf against "
            f"{one.main_us:,.0f} at N=1 ({p.main_us / one.main_us:.2f}x); main plus front "
            f"ends {split_us:,.0f} ({split_us - one.main_us:+,.0f} us/inf for the hop and "
            f"the split); a front-end process serves {1e6 / p.frontend_us:,.0f} infer/s per "
            f"core of its own")


def predicted_table(points: list[Costs], counts: list[int], cores: int) -> str:
    """X(N) on a machine of `cores` cores, from the per-request costs of the largest N
    measured (taken as constant in N, which batching and polling make only roughly so)."""
    header = ["protocol"] + [f"N={n}" for n in counts] + ["binds at the largest"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for protocol in dict.fromkeys(p.protocol for p in points):
        mine = [p for p in points if p.protocol == protocol]
        one = next((p for p in mine if p.count == 1), None)
        split = max(mine, key=lambda p: p.count)
        row, binds = [protocol], ""
        for n in counts:
            base = one if n == 1 and one is not None else split
            ceilings = base.ceilings(n, cores)
            row.append(f"{min(ceilings.values()):,.0f}")
            binds = min(ceilings, key=ceilings.get)
        lines.append("| " + " | ".join(row + [binds]) + " |")
    return "\n".join(lines)


def report(points: list[Costs], args: argparse.Namespace, servers: list,
           load: tuple[str, str], argv: list[str]) -> str:
    split = [p for p in points if p.count > 1 and p.frontend_us]
    parts = [
        "# Front-end processes: throughput and CPU by process", "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M:%S')}; {os.cpu_count()} CPUs, perf_analyzer "
        f"on the same machine; load average {load[0]} before, {load[1]} after",
        f"- run: `python perf/frontend_scaling.py {' '.join(argv)}`",
        f"- 64 B FP32 to `{args.model}`, sync, concurrency {args.concurrency}, "
        f"{args.rounds} round(s) (medians), gRPC contexts per connection: {args.grpc_share}; "
        f"competition: {competition.describe(args.competition)}", "",
        "## Measured", "",
        "CPU per inference of each kind of process, medians of the rounds; each front "
        "end's share and the connections each serving process held (its busiest moment) "
        "are the first round's. Main busy: the cores the main process used.", "",
        measured_table(points), "",
        "## Ceilings (infer/s) at each point", "", ceilings_table(points), "",
        "## The hop", "", *(hop_lines(points) or ["- no N >= 2 point measured"]), "",
    ]
    if split:
        for cores in dict.fromkeys([os.cpu_count(), 16]):
            parts += [f"## X(N) predicted on {cores} cores", "",
                      predicted_table(points, list(PREDICTED_COUNTS), cores), ""]
    parts += ["## Servers", "", "```"] + [" ".join(s.command) for s in servers] + ["```", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------- CLI


def default_counts() -> list[int]:
    """1 and 2, and 4 and 8 where the machine has at least twice as many cores (the
    client and the model's worker need cores too)."""
    return [n for n in COUNTS if n <= 2 or 2 * n <= (os.cpu_count() or 1)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default=None,
                        help="front-end process counts, e.g. 1,2,4,8 (default: 1,2, and "
                             "4,8 with at least 8,16 cores)")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="perf_analyzer's concurrency (default: 16, or 4 per process "
                             "of the largest count when that is more)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("-p", "--measurement-interval", type=int, default=1000, help="ms")
    parser.add_argument("-s", "--stability-percentage", type=int, default=30)
    parser.add_argument("-r", "--max-trials", type=int, default=6)
    parser.add_argument("--grpc-share", type=int, default=1,
                        help=f"perf_analyzer's gRPC contexts per connection "
                             f"({compare.GRPC_SHARE_VARIABLE})")
    parser.add_argument("--competition", type=int, default=0, metavar="K",
                        help="K busy loops of another program on the cores while measuring")
    parser.add_argument("--model-repository", type=Path,
                        default=PERF_DIR / "repos" / "python_identity")
    parser.add_argument("-m", "--model", default="identity_py")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--mini-args", default="", help="extra flags for mini_triton")
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.counts = ([int(c) for c in args.counts.split(",")] if args.counts
                   else default_counts())
    args.protocols = args.protocols.split(",")
    args.concurrency = args.concurrency or max(16, 4 * max(args.counts))
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out_dir = args.results_dir or RESULTS_DIR / time.strftime("scaling-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    servers = [compare.make_server(f"{compare_table.OURS}-n{n}", args, out_dir, str(n))
               for n in args.counts]
    os.environ[compare.GRPC_SHARE_VARIABLE] = str(args.grpc_share)  # perf_analyzer's
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(args.model, args.ready_timeout)
        before = compare.load_average()
        with competition.busy_loops(args.competition):
            results = measure_all(servers, args, out_dir)
    except RuntimeError as exc:
        print(f"[scaling] {exc}", file=sys.stderr)
        return 2
    finally:
        for server in servers:
            server.stop()
    save_json(results, out_dir / "results.json")
    points = [costs_of(m) for m in compare_table.medians(
        results, key=lambda m: (m.protocol,))]
    points.sort(key=lambda p: (p.protocol, p.count))
    text = report(points, args, servers, (before, compare.load_average()), argv)
    (out_dir / "scaling.md").write_text(text)
    print(text)
    print(f"[scaling] report, logs and perf_analyzer's files in {out_dir}", file=sys.stderr)
    return 0 if all(m.ok for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The comparison harness's own arithmetic (perf/compare.py, compare_table.py,
process_cpu.py, frontend_scaling.py): which server goes first, which ratios a table
shows, how a process's role is told, and where the scaling model says a server runs out.
Nothing here measures speed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "perf"))
import compare  # noqa: E402
import compare_table  # noqa: E402
import frontend_scaling  # noqa: E402
import process_cpu  # noqa: E402
from measurements import Measurement  # noqa: E402


def measured(server: str, throughput: float, cpu_us: float, round_number: int = 1,
             level: int = 4, p50_us: float = 500.0) -> Measurement:
    return Measurement("http", "concurrency", level, throughput, p50_us, p50_us, p50_us,
                       2 * p50_us, server=server,
                       extra={"elements": 16, "route": "http", "round": round_number,
                              "cpu_us": cpu_us})


@pytest.mark.parametrize("cmdline, role", [
    (["/venv/bin/python", "-m", "mini_triton", "--model-repository", "r"], "main"),
    (["/venv/bin/python", "-m", "mini_triton.frontend_processes.child"], "frontend"),
    (["/venv/bin/python", "-m", "mini_triton.backends.python.worker", "21", "m_0_0"], "worker"),
    (["/opt/backends/python/triton_python_backend_stub", "model.py", "shm"], "worker"),
    (["/opt/tritonserver", "--model-repository", "r"], "main"),
])
def test_process_role_from_command_line(cmdline, role):
    assert process_cpu.role_of(cmdline) == role


def test_each_server_goes_first_in_turn():
    servers = ["triton", "mini_triton-n1", "mini_triton-n2"]
    orders = [compare_table.rotated(servers, turn) for turn in range(3)]
    assert [order[0] for order in orders] == servers
    assert all(sorted(order) == sorted(servers) for order in orders)


def test_two_servers_flip_at_every_point():
    assert compare_table.rotated(["mini_triton", "triton"], 1) == ["triton", "mini_triton"]
    assert compare_table.rotated(["mini_triton", "triton"], 2) == ["mini_triton", "triton"]


def test_each_count_against_triton_and_against_the_first_count():
    names = ["triton", "mini_triton-n1", "mini_triton-n2", "mini_triton-n4"]
    assert compare_table.comparisons(names) == [
        ("mini_triton-n1", "triton"), ("mini_triton-n2", "triton"),
        ("mini_triton-n4", "triton"),
        ("mini_triton-n2", "mini_triton-n1"), ("mini_triton-n4", "mini_triton-n1")]
    assert compare_table.comparisons(["mini_triton", "triton"]) == [("mini_triton", "triton")]


def test_table_of_several_counts_shows_medians_and_ratios():
    results = [measured("triton", 1000, 200, 1), measured("mini_triton-n1", 1500, 150, 1),
               measured("mini_triton-n2", 1800, 180, 1),
               measured("triton", 1000, 200, 2), measured("mini_triton-n1", 1300, 150, 2),
               measured("mini_triton-n2", 2000, 180, 2),
               measured("triton", 1000, 200, 3), measured("mini_triton-n1", 1400, 150, 3),
               measured("mini_triton-n2", 2100, 180, 3)]
    header, _, row = compare_table.table(results).splitlines()
    cells = dict(zip(header.strip("| ").split(" | "), row.strip("| ").split(" | "),
                     strict=True))
    assert cells["N=1 infer/s"] == "1,400" and cells["N=2 infer/s"] == "2,000"
    assert cells["N=1 / Triton"] == "1.40x" and cells["N=2 / Triton"] == "2.00x"
    assert cells["N=2 / N=1"] == "1.43x"
    assert cells["CPU N=2 / Triton"] == "0.90x"
    assert cells["each round, N=2 / N=1"] == "1.20 1.54 1.50"


def test_one_configuration_keeps_the_table_it_had():
    results = [measured("triton", 1000, 200), measured("mini_triton", 1250, 100)]
    header = compare_table.table(results).splitlines()[0]
    assert header == ("| size | route | c | Triton infer/s | ours infer/s | ours / Triton | "
                      "Triton CPU us/inf | ours CPU us/inf | CPU ours / Triton |")


def test_latency_table_reads_the_lowest_concurrency():
    results = [measured(s, 1000, 100, level=level, p50_us=p50)
               for s, p50 in (("triton", 400.0), ("mini_triton-n1", 300.0),
                              ("mini_triton-n2", 450.0)) for level in (1, 4)]
    lines = compare_table.latency_table(results).splitlines()
    assert len(lines) == 3 and "| 64 B | http | 1 | 0.40 | 0.30 | 0.45 |" in lines[2]
    assert lines[2].endswith("| 1.50x |")  # p50 N=2 / N=1


@pytest.mark.parametrize("spec, counts", [("1,2", ["1", "2"]), ("auto,4", ["auto", "4"])])
def test_frontend_counts(spec, counts):
    assert compare.frontend_counts(spec) == counts


@pytest.mark.parametrize("spec", ["0", "1,x", "2,2", "-1"])
def test_bad_frontend_counts(spec):
    with pytest.raises(argparse.ArgumentTypeError):
        compare.frontend_counts(spec)


def costs(count: int, main_us: float, frontend_us: float) -> frontend_scaling.Costs:
    return frontend_scaling.Costs(count=count, protocol="http", throughput=5000,
                                  main_us=main_us, frontend_us=frontend_us, worker_us=25,
                                  client_us=75, workers=1, frontend_each_us=[],
                                  connections=[])


def test_the_main_process_binds_on_many_cores():
    ceilings = costs(8, main_us=80, frontend_us=100).ceilings(cores=16)
    assert ceilings["main"] == pytest.approx(12_500)
    assert ceilings["front ends"] == pytest.approx(80_000)
    assert min(ceilings, key=ceilings.get) == "main"


def test_at_one_process_the_main_is_the_front_end():
    ceilings = costs(1, main_us=100, frontend_us=0).ceilings(cores=2)
    assert ceilings["front ends"] == ceilings["main"] == pytest.approx(10_000)
    assert ceilings["cores"] == pytest.approx(2e6 / 200)

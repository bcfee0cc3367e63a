"""ModelStats: an execution recorded at once (`record_executed`, what the schedulers
call once per batch) adds up to exactly what recording the batch and each of its
successful requests one by one adds, summaries included."""

from __future__ import annotations

from mini_triton.core.stats import ExecutionTiming, ModelStats


def numbers(stats: ModelStats) -> dict:
    return {
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "durations": {name: d.as_dict() for name, d in stats.durations.items()},
        "batch_stats": {size: (b.compute_input.as_dict(), b.compute_infer.as_dict(),
                               b.compute_output.as_dict())
                        for size, b in stats.batch_stats.items()},
        "summaries": {name: (w.count, w.total, [v for _, v in w.samples])
                      for name, w in stats.summaries.items()},
    }


def test_an_execution_recorded_at_once_adds_what_each_request_would():
    timings = [ExecutionTiming(10_000, 14_000, 25_000, 31_000),
               ExecutionTiming(50_000, 49_000, 70_000, 71_000)]  # input_ns clamps to 0
    executions = [(timings[0], 5, [(9_000, 1), (4_000, 3)]),  # one request failed
                  (timings[1], 2, [(60_000, 1), (45_000, 1)]),  # queued after start: 0
                  (timings[0], 5, [])]
    one_by_one = ModelStats("m", "1", summaries=True)
    at_once = ModelStats("m", "1", summaries=True)
    for timing, batch_size, succeeded in executions:
        one_by_one.record_batch(timing, batch_size)
        for queue_start, rows in succeeded:
            one_by_one.record_compute(timing.start - queue_start, timing.input_ns,
                                      timing.infer_ns, timing.output_ns, rows)
        at_once.record_executed(timing, batch_size, succeeded)
    assert numbers(at_once) == numbers(one_by_one)
    assert at_once.inference_count == 6
    assert at_once.durations["queue"].as_dict() == {"count": 4, "ns": 1_000 + 6_000 + 0 + 5_000}

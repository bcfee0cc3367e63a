"""Ensembles: Triton's config checks and messages, and the scheduler running
the step graph against a stand-in server whose steps the test completes by
hand (DAG order, concurrency, fan-out, failures, in-flight limits)."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

import numpy as np
import pytest

from mini_triton.core.errors import Code, TritonError, internal
from mini_triton.core.request import InferenceRequest, InferenceResponse, ResponseStream
from mini_triton.core.stats import ModelStats
from mini_triton.core.tensor import Tensor
from mini_triton.scheduling.ensemble import EnsembleScheduler
from mini_triton.config.validation import run_rules
from mini_triton.config.validation.ensemble import CONFIG_RULES
from mini_triton.config.validation.ensemble import validate_ensemble_steps as check_ensemble_steps
from recording_backend import parse_config


def tensor_config(name: str, dims: str = "[ -1 ]", data_type: str = "TYPE_FP32") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: {dims} }}'


def step_text(model: str, inputs: dict, outputs: dict) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1 {maps} }}'


def ensemble(steps: list[str], inputs=("IN",), outputs=("OUT",), extra: str = "",
             max_batch_size: int = 8, scheduling_extra: str = ""):
    return parse_config(
        f'name: "ens" platform: "ensemble" max_batch_size: {max_batch_size} '
        f'input [ {", ".join(tensor_config(n) for n in inputs)} ] '
        f'output [ {", ".join(tensor_config(n) for n in outputs)} ] '
        f'ensemble_scheduling {{ {scheduling_extra} step [ {", ".join(steps)} ] }} {extra}')


def model(name: str, inputs=("INPUT0",), outputs=("OUTPUT0",), max_batch_size: int = 8,
          extra: str = "", data_type: str = "TYPE_FP32"):
    return parse_config(
        f'name: "{name}" max_batch_size: {max_batch_size} '
        f'input [ {", ".join(tensor_config(n, data_type=data_type) for n in inputs)} ] '
        f'output [ {", ".join(tensor_config(n, data_type=data_type) for n in outputs)} ] '
        f'{extra}')


DIAMOND = [
    step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
    step_text("b", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
    step_text("c", {"INPUT0": "x"}, {"OUTPUT0": "z"}),
    step_text("d", {"INPUT0": "y", "INPUT1": "z"}, {"OUTPUT0": "OUT"}),
]
DIAMOND_MODELS = {"a": model("a"), "b": model("b"), "c": model("c"),
                  "d": model("d", inputs=("INPUT0", "INPUT1"))}


# --- config checks on the ensemble alone ---


def check_ensemble_config(config) -> None:
    run_rules(CONFIG_RULES, config)


def refused(config) -> str:
    with pytest.raises(TritonError) as error:
        check_ensemble_config(config)
    assert error.value.code is Code.INVALID_ARG
    return error.value.message


def test_valid_diamond_passes():
    check_ensemble_config(ensemble(DIAMOND))


def test_instance_groups_on_an_ensemble_are_refused():
    config = ensemble(DIAMOND, extra="instance_group [ { count: 1 } ]")
    assert refused(config) == "instance group should not be specified for ensemble 'ens'"


def test_warmup_on_an_ensemble_is_refused():
    config = ensemble(DIAMOND, extra='model_warmup [ { name: "w" batch_size: 1 } ]')
    assert refused(config) == "model_warmup can not be specified for ensemble 'ens'"


def test_unused_ensemble_input_is_refused():
    config = ensemble(DIAMOND, inputs=("IN", "EXTRA"))
    assert refused(config) == "ensemble input 'EXTRA' for ensemble ens' is not used"


def test_output_never_written_names_the_unconnected_tensor():
    steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
             step_text("d", {"INPUT0": "x", "INPUT1": "nowhere"}, {"OUTPUT0": "OUT"})]
    assert refused(ensemble(steps)) == (
        "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
        "tensors, 'nowhere', is not connected")


def test_cycle_is_refused():
    steps = [step_text("a", {"INPUT0": "IN", "INPUT1": "loop"}, {"OUTPUT0": "x"}),
             step_text("b", {"INPUT0": "x"}, {"OUTPUT0": "loop"}),
             step_text("c", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
    message = refused(ensemble(steps))
    assert message.startswith("output 'OUT' for ensemble 'ens' is not written")


def test_unused_step_output_is_refused():
    steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "spare"})]
    assert refused(ensemble(steps)) == "ensemble tensor 'spare' is unused in ensemble 'ens'"


def test_tensor_written_twice_is_refused():
    steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
             step_text("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]
    assert refused(ensemble(steps)) == ("ensemble tensor 'OUT' can appear in an output map "
                                        "only once for ensemble 'ens' step 1")


# --- checks against the step models ---


def steps_refused(config, models) -> str:
    with pytest.raises(TritonError) as error:
        check_ensemble_steps(config, models)
    return error.value.message


def test_step_with_smaller_max_batch_size_is_refused():
    models = {**DIAMOND_MODELS, "b": model("b", max_batch_size=4)}
    assert steps_refused(ensemble(DIAMOND), models) == (
        "ensemble ens allows maximum batch size 8, but it contains model b which only allows "
        "maximum batch size to be 4")


def test_unmapped_required_input_is_refused():
    models = {**DIAMOND_MODELS, "b": model("b", inputs=("INPUT0", "INPUT9"))}
    assert steps_refused(ensemble(DIAMOND), models) == (
        "in ensemble ens, input INPUT9 in model b is not mapped to any ensemble tensors")


def test_mapping_to_missing_input_or_output_is_refused():
    steps = [step_text("a", {"NOPE": "IN"}, {"OUTPUT0": "OUT"})]
    assert steps_refused(ensemble(steps), {"a": model("a")}) == (
        "in ensemble ens, ensemble tensor IN is mapping to non-existing input NOPE in model a")
    steps = [step_text("a", {"INPUT0": "IN"}, {"NOPE": "OUT"})]
    assert steps_refused(ensemble(steps), {"a": model("a")}) == (
        "in ensemble ens, ensemble tensor OUT is mapped from non-existing output NOPE in model a")


def test_inconsistent_data_type_is_refused():
    models = {**DIAMOND_MODELS, "b": model("b", data_type="TYPE_INT32")}
    message = steps_refused(ensemble(DIAMOND), models)
    assert message.startswith("in ensemble ens, ensemble tensor x: inconsistent data type: "
                              "TYPE_FP32 is inferred from model a while TYPE_INT32")


def test_a_decoupled_step_makes_the_ensemble_decoupled():
    decoupled = model("a", extra="model_transaction_policy { decoupled: true }")
    assert not check_ensemble_steps(ensemble(DIAMOND), DIAMOND_MODELS)
    steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
             step_text("b", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
    assert check_ensemble_steps(ensemble(steps), {"a": decoupled, "b": model("b")})


def test_step_mixing_decoupled_responses_with_other_tensors_is_refused():
    models = {**DIAMOND_MODELS, "e": model("e"),
              "b": model("b", extra="model_transaction_policy { decoupled: true }")}
    steps = DIAMOND[:3] + [step_text("d", {"INPUT0": "y", "INPUT1": "z"}, {"OUTPUT0": "w"}),
                           step_text("e", {"INPUT0": "w"}, {"OUTPUT0": "OUT"})]
    assert steps_refused(ensemble(steps), models) == (
        "in ensemble ens, step of model 'd' receives inputs originated from different "
        "decoupled models")


# --- the scheduler, against a stand-in server ---


class StandInServer:
    """Records step requests; each step answers when the test says so, or at once
    (`auto`): OUTPUTn = INPUTn + 1, and for several inputs their sum + 1."""

    def __init__(self, models: dict, auto=(), responses: dict | None = None):
        self.loop = asyncio.get_running_loop()
        self.models = {name: SimpleNamespace(config=config, scheduler=SimpleNamespace(
            cancel=lambda request: None)) for name, config in models.items()}
        self.manager = SimpleNamespace(get=self.get)
        self.auto = set(auto)
        self.responses = responses or {}  # model -> how many responses (decoupled)
        self.calls: list[tuple[InferenceRequest, ResponseStream]] = []
        self.log: list[str] = []
        self.changed = asyncio.Condition()
        self.inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}

    def get(self, name: str, version: str = "", namespace: str = ""):
        if name not in self.models:
            raise TritonError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return self.models[name]

    def infer(self, request: InferenceRequest) -> ResponseStream:
        config = self.models[request.model_name].config
        request.decoupled = config.model_transaction_policy.decoupled
        request.stream = ResponseStream(self.loop)
        self.calls.append((request, request.stream))
        self.log.append(f"start {request.model_name}")
        name = request.model_name
        self.inflight[name] = self.inflight.get(name, 0) + 1
        self.max_inflight[name] = max(self.max_inflight.get(name, 0), self.inflight[name])
        self.loop.create_task(self._notify())
        if name in self.auto:
            self.loop.call_soon(self.complete, request)
        return request.stream

    async def _notify(self):
        async with self.changed:
            self.changed.notify_all()

    async def started(self, name: str, count: int = 1) -> list[InferenceRequest]:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(
                lambda: len(self.pending(name)) >= count), 5)
        return self.pending(name)

    def pending(self, name: str) -> list[InferenceRequest]:
        return [r for r, _ in self.calls if r.model_name == name and not r.completed]

    def complete(self, request: InferenceRequest, error: TritonError | None = None) -> None:
        self.log.append(f"end {request.model_name}")
        self.inflight[request.model_name] -= 1
        if error is not None:
            request.respond(request.error_response(error))
            return
        total = sum(t.data for t in request.inputs) + 1
        outputs = [Tensor("OUTPUT0", "FP32", total.shape, total)]
        if request.decoupled:
            for index in range(self.responses.get(request.model_name, 1)):
                data = total + index * 100
                request.respond(InferenceResponse(request.model_name, "1", request.id,
                                                  [Tensor("OUTPUT0", "FP32", data.shape, data)],
                                                  final=False))
            request.respond(InferenceResponse(request.model_name, "1", request.id,
                                              final=True, empty=True))
        else:
            request.respond(InferenceResponse(request.model_name, "1", request.id, outputs))


def ensemble_request(value: float = 1.0, **parameters) -> InferenceRequest:
    data = np.full((1, 2), value, np.float32)
    request = InferenceRequest("ens", "1", "req", [Tensor("IN", "FP32", (1, 2), data)],
                               parameters=parameters, batch_size=1)
    request.stream = ResponseStream(asyncio.get_running_loop())
    return request


def scheduler_for(server: StandInServer, config) -> EnsembleScheduler:
    context = SimpleNamespace(config=config, server=server)
    return EnsembleScheduler(context, ModelStats("ens", "1"))


async def settle(condition, rounds: int = 100) -> None:
    """Let the loop run queued callbacks until `condition` holds."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    assert condition()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


def test_steps_run_when_inputs_exist_and_branches_run_concurrently():
    async def scenario():
        server = StandInServer(DIAMOND_MODELS)
        scheduler = scheduler_for(server, ensemble(DIAMOND))
        request = ensemble_request(1.0)
        scheduler.submit(request)
        (a,) = await server.started("a")
        assert server.log == ["start a"]
        server.complete(a)
        (b,) = await server.started("b")
        (c,) = await server.started("c")
        assert server.log == ["start a", "end a", "start b", "start c"]  # both, neither done
        server.complete(c)
        await asyncio.sleep(0)
        assert not server.pending("d")  # d needs y too
        server.complete(b)
        (d,) = await server.started("d")
        server.complete(d)
        response = await request.stream.final()
        assert response.error is None
        # a: 1+1=2; b, c: 3 each; d: 3+3+1 = 7
        assert [t.name for t in response.outputs] == ["OUT"]
        assert (response.outputs[0].data == 7).all()
        await settle(lambda: scheduler.inflight() == 0)
        assert scheduler.stats.execution_count == 1 and scheduler.stats.inference_count == 1

    run(scenario())


def test_every_step_carries_the_request_parameters():
    async def scenario():
        server = StandInServer(DIAMOND_MODELS, auto="abcd")
        scheduler = scheduler_for(server, ensemble(DIAMOND))
        request = ensemble_request(sequence_id=7, sequence_start=True, priority=2,
                                   timeout=100)
        scheduler.submit(request)
        assert (await request.stream.final()).error is None
        assert len(server.calls) == 4
        for step_request, _ in server.calls:
            assert step_request.parameters == {"sequence_id": 7, "sequence_start": True,
                                               "priority": 2, "timeout": 100}

    run(scenario())


def test_a_failing_step_fails_the_ensemble_request_once():
    async def scenario():
        server = StandInServer(DIAMOND_MODELS, auto="ad")
        scheduler = scheduler_for(server, ensemble(DIAMOND))
        request = ensemble_request()
        scheduler.submit(request)
        (b,) = await server.started("b")
        (c,) = await server.started("c")
        server.complete(b, internal("step b broke"))
        response = await request.stream.final()
        assert response.error.message == "in ensemble 'ens', step b broke"  # Triton's words
        assert response.error.failure_reason == "OTHER"  # as Triton counts it
        server.complete(c)
        await settle(lambda: scheduler.inflight() == 0)
        assert request.stream._items == collections.deque()  # nothing after the final
        assert scheduler.stats.execution_count == 0

    run(scenario())


def test_decoupled_step_fans_out_and_the_ensemble_streams():
    async def scenario():
        models = {"a": model("a", extra="model_transaction_policy { decoupled: true }"),
                  "b": model("b")}
        steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
                 step_text("b", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
        server = StandInServer(models, auto="ab", responses={"a": 3})
        config = ensemble(steps)
        scheduler = scheduler_for(server, config)
        assert config.model_transaction_policy.decoupled
        request = ensemble_request(1.0)
        request.decoupled = True
        scheduler.submit(request)
        responses = [response async for response in request.stream]
        assert [r.final for r in responses] == [False, False, False, True]
        assert responses[-1].empty
        values = sorted(float(r.outputs[0].data.reshape(-1)[0]) for r in responses[:3])
        assert values == [3.0, 103.0, 203.0]
        assert len([r for r, _ in server.calls if r.model_name == "b"]) == 3

    run(scenario())


def test_max_inflight_requests_bounds_step_requests_in_flight():
    async def scenario():
        models = {"a": model("a", extra="model_transaction_policy { decoupled: true }"),
                  "b": model("b")}
        steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
                 step_text("b", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
        server = StandInServer(models, auto="a", responses={"a": 5})
        scheduler = scheduler_for(server, ensemble(steps,
                                                   scheduling_extra="max_inflight_requests: 2"))
        request = ensemble_request()
        scheduler.submit(request)
        done = 0
        while done < 5:
            pending = await server.started("b", 1)
            assert len(pending) <= 2
            server.complete(pending[0])
            done += 1
        responses = [response async for response in request.stream]
        assert len(responses) == 6
        assert server.max_inflight["b"] == 2

    run(scenario())


def test_missing_step_model_is_reported_as_triton_does():
    async def scenario():
        server = StandInServer({"a": model("a")})
        steps = [step_text("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
                 step_text("gone", {"INPUT0": "x"}, {"OUTPUT0": "OUT"})]
        with pytest.raises(TritonError) as error:
            scheduler_for(server, ensemble(steps))
        assert error.value.message == ("ensemble 'ens' depends on 'gone' which has no loaded "
                                       "version")

    run(scenario())


def test_reloaded_step_is_checked_again():
    async def scenario():
        server = StandInServer(dict(DIAMOND_MODELS), auto="abcd")
        scheduler = scheduler_for(server, ensemble(DIAMOND))
        server.models["b"] = SimpleNamespace(config=model("b", max_batch_size=2),
                                             scheduler=None)
        with pytest.raises(TritonError, match="only allows maximum batch size to be 2"):
            scheduler.submit(ensemble_request())

    run(scenario())


def test_cancelled_ensemble_request_ends_cancelled_and_cancels_its_steps():
    async def scenario():
        server = StandInServer(DIAMOND_MODELS)
        cancelled = []
        for stand_in in server.models.values():
            stand_in.scheduler.cancel = cancelled.append
        scheduler = scheduler_for(server, ensemble(DIAMOND))
        request = ensemble_request()
        scheduler.submit(request)
        (a,) = await server.started("a")
        scheduler.cancel(request)
        response = await request.stream.final()
        assert response.error.code is Code.CANCELLED
        assert cancelled == [a] and a.cancelled
        server.complete(a)
        await settle(lambda: scheduler.inflight() == 0)
        assert not server.pending("b")  # nothing runs after the cancellation

    run(scenario())

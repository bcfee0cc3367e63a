"""Front ends ask the service for everything outside inference through one awaitable
entry point, `InferenceService.ask`, limited to the methods of its ASKED table, whose
answers are plain picklable values: so that a front end in another process can be given
the same answers by the main process. In this process, an answer is the method's own."""

from __future__ import annotations

import ast
import asyncio
import inspect
import pickle
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from mini_triton.core.cuda_shared_memory import CudaSharedMemoryRegistry
from mini_triton.core.errors import Code, TritonError
from mini_triton.core.shared_memory import SharedMemoryRegistry
from mini_triton.service import ASKED, InferenceService

FRONTENDS = Path(__file__).resolve().parent.parent / "mini_triton" / "frontends"

# What a front end may reach on the service other than `ask`: the hot inference calls,
# the coroutines, and what needs no state of the service or is its own object.
DIRECT = frozenset({
    "ask", "infer", "start_stream", "start_unary", "cancel", "live", "check_ready", "check_model_ready",
    "load_model", "unload_model", "register_model_repository", "unregister_model_repository",
    "check_repository_name", "tracer", "stream_budget",
})
# A region registry is reached only for its check of a name (a classmethod).
REGISTRIES = frozenset({"system_shm", "cuda_shm"})

# (front-end module, what it reaches directly): why. Each is to be removed.
DIRECT_EXCEPTIONS = {
    ("cloud/vertex_ai.py", "repository_index"):
        "default_model() chooses the predict route's model at start-up, in the main "
        "process, before any front end serves",
}


def ask(server, method: str, *args):
    """`service.ask(method, *args)` run on the server's loop, as a front end runs it."""
    service = server.server.service
    return asyncio.run_coroutine_threadsafe(service.ask(method, *args), server.loop).result(30)


def round_trip(value):
    return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))


def test_every_asked_method_is_a_plain_method_of_the_service():
    for name in ASKED:
        method = getattr(InferenceService, name, None)
        assert inspect.isfunction(method), name
        assert not inspect.iscoroutinefunction(method), name
        assert not name.startswith("_"), name


@pytest.mark.parametrize("method, args", [
    ("server_metadata", ()),
    ("model_ready", ("identity_fp32",)),
    ("model_metadata", ("identity_fp32",)),
    ("model_config", ("identity_fp32", "")),
    ("model_folder", ("identity_fp32",)),
    ("model_statistics", ("identity_fp32",)),
    ("repository_index", (True,)),
    ("trace_settings", ()),
    ("logging_settings", ()),
    ("system_shm_status", ()),
    ("cuda_shm_status", ()),
    ("sagemaker_models", ()),
    ("sagemaker_model", ("not_loaded",)),
])
def test_an_answer_is_the_method_s_own_and_survives_pickling(default_server, method, args):
    answer = ask(default_server, method, *args)
    assert answer == getattr(default_server.server.service, method)(*args)
    assert round_trip(answer) == answer


def test_the_metrics_text_is_asked_as_prometheus_reads_it(default_server):
    text = ask(default_server, "metrics_text")
    assert "# TYPE nv_inference_request_success counter" in text
    assert round_trip(text) == text


@pytest.mark.parametrize("method", ["infer", "cancel", "_submit", "manager", "load_model",
                                    "ask", "no_such_method"])
def test_a_method_outside_the_table_is_refused_as_an_internal_error(default_server, method):
    with pytest.raises(TritonError) as refused:
        ask(default_server, method)
    assert refused.value.code is Code.INTERNAL
    assert f"'{method}'" in refused.value.message


def test_an_asked_method_s_error_is_its_own(default_server):
    with pytest.raises(TritonError) as direct:
        default_server.server.service.model_config("no_such_model")
    with pytest.raises(TritonError) as asked:
        ask(default_server, "model_config", "no_such_model")
    assert (asked.value.code, asked.value.message) == (direct.value.code, direct.value.message)


def test_a_region_is_registered_listed_and_unregistered_through_ask(default_server):
    region = shared_memory.SharedMemory(create=True, size=64)
    try:
        ask(default_server, "system_shm_register", "asked_region", "/" + region.name, 0, 64)
        status = ask(default_server, "system_shm_status", "asked_region")
        assert status == [{"name": "asked_region", "key": "/" + region.name, "offset": 0,
                           "byte_size": 64}]
        ask(default_server, "system_shm_unregister", "asked_region")
        with pytest.raises(TritonError) as gone:
            ask(default_server, "system_shm_status", "asked_region")
        assert gone.value.code is Code.NOT_FOUND
    finally:
        region.close()
        region.unlink()


def test_sagemaker_s_models_are_added_listed_and_removed_through_ask(default_server):
    """SageMaker's multi-model registrations are the service's, one table for every
    front-end process."""
    assert ask(default_server, "sagemaker_models") == {}
    ask(default_server, "sagemaker_model_add", "hash1", "/opt/ml/models/hash1", "m1")
    assert ask(default_server, "sagemaker_model", "hash1") == ("/opt/ml/models/hash1", "m1")
    listed = ask(default_server, "sagemaker_models")
    assert listed == {"hash1": ("/opt/ml/models/hash1", "m1")}
    assert round_trip(listed) == listed
    removed = ask(default_server, "sagemaker_model_remove", "hash1")
    assert removed == ("/opt/ml/models/hash1", "m1")
    assert ask(default_server, "sagemaker_model_remove", "hash1") is None
    assert ask(default_server, "sagemaker_model", "hash1") is None
    assert ask(default_server, "sagemaker_models") == {}


@pytest.mark.parametrize("registry, kind", [(SharedMemoryRegistry, "system"),
                                            (CudaSharedMemoryRegistry, "cuda")])
def test_a_region_name_is_checked_without_a_registry(registry, kind):
    """A front-end process has no registrations: the check of a name is the class's."""
    registry.check_name("a_region")
    with pytest.raises(TritonError) as refused:
        registry.check_name("")
    assert refused.value.code is Code.INVALID_ARG
    assert f"register {kind} shared memory region" in refused.value.message


def reached_on_the_service(tree: ast.AST) -> set[str]:
    """What `service.X` / `<...>.service.X` names in a module; a registry counts as
    itself only where something other than its check_name is reached through it."""
    reached = set()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if owner_name != "service":
            continue
        parent = parents.get(node)
        if node.attr in REGISTRIES and isinstance(parent, ast.Attribute) \
                and parent.attr == "check_name":
            continue
        reached.add(node.attr)
    return reached


def test_front_ends_ask_the_service_for_everything_outside_inference():
    wrong = sorted((str(path.relative_to(FRONTENDS)), name)
                   for path in FRONTENDS.rglob("*.py")
                   for name in reached_on_the_service(ast.parse(path.read_text()))
                   if name not in DIRECT)
    assert [entry for entry in wrong if entry not in DIRECT_EXCEPTIONS] == []
    assert set(DIRECT_EXCEPTIONS) - set(wrong) == set(), "a fixed one leaves the list"

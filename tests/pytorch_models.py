"""TorchScript models for the PyTorch backend's tests, built in code with fixed seeds,
and their folders written as Triton's pytorch_backend docs show them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Dict, List

import torch

FEATURES, HIDDEN, CLASSES = 16, 32, 8


class AddSub(torch.nn.Module):
    """Arguments named after the tensors, in the opposite order to the config's."""

    def forward(self, INPUT1: torch.Tensor, INPUT0: torch.Tensor):
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class Mlp(torch.nn.Module):
    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN,
                 classes: int = CLASSES):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                                          torch.nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class AllTypes(torch.nn.Module):
    """Each of the nine numeric datatypes Triton maps, echoed through a computation."""

    def forward(self, b: torch.Tensor, u8: torch.Tensor, i8: torch.Tensor, i16: torch.Tensor,
                i32: torch.Tensor, i64: torch.Tensor, f16: torch.Tensor, f32: torch.Tensor,
                f64: torch.Tensor):
        return (~b, u8 + 1, i8 - 1, i16 * 2, i32 * 3, i64 * 4, f16 * 2, f32 / 2, f64 + 0.5)


class Upper(torch.nn.Module):
    def forward(self, text: List[str]) -> List[str]:
        return [t.upper() for t in text]


class DictSum(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["A"] + 10 * inputs["B"]


class Ordered(torch.nn.Module):
    """Arguments whose names the config does not use: config order decides."""

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return x * 100 + y, x - y


class InferenceFlag(torch.nn.Module):
    """Says whether forward() ran in inference mode (a tensor made in it is one)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.full_like(x, y.is_inference(), dtype=torch.bool)


class AsDouble(torch.nn.Module):
    """Returns FP64 whatever the config says."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


class Accumulate(torch.nn.Module):
    """Implicit state: the running sum of a sequence's inputs."""

    def forward(self, x: torch.Tensor, state: torch.Tensor):
        total = state + x
        return total, total


class Project(torch.nn.Module):
    """Fails on inputs of another width than 4 (a shape the config leaves free)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.matmul(self.weight)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return Mlp().eval()


def save_script(module: torch.nn.Module, folder: Path, filename: str = "model.pt") -> Path:
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    path = version / filename
    with warnings.catch_warnings():  # TorchScript is what Triton's backend serves
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(module).save(str(path))
    return path


def write(repository: Path, name: str, module: torch.nn.Module | None, config: str,
          filename: str = "model.pt") -> Path:
    """A model folder: the scripted module (if any) and its config.pbtxt."""
    folder = repository / name
    if module is not None:
        save_script(module, folder, filename)
    else:
        (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    return folder


def tensor(name: str, data_type: str, dims: str, extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: [ {dims} ] {extra}}}'


def io(inputs: list[str], outputs: list[str]) -> str:
    return f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n"


ADD_SUB = 'backend: "pytorch"\nmax_batch_size: 8\n' + io(
    [tensor("INPUT0", "TYPE_FP32", "4"), tensor("INPUT1", "TYPE_FP32", "4")],
    [tensor("OUTPUT__0", "TYPE_FP32", "4"), tensor("OUTPUT__1", "TYPE_FP32", "4")])

MLP = f"""platform: "pytorch_libtorch"
max_batch_size: 32
dynamic_batching {{ max_queue_delay_microseconds: 2000000 preferred_batch_size: [ 4 ] }}
model_warmup [ {{ name: "zeros" batch_size: 2
  inputs {{ key: "INPUT__0" value: {{ data_type: TYPE_FP32 dims: [ {FEATURES} ] zero_data: true }} }} }} ]
""" + io([tensor("INPUT__0", "TYPE_FP32", str(FEATURES))],
         [tensor("OUTPUT__0", "TYPE_FP32", str(CLASSES))])

TYPES = [("b", "TYPE_BOOL"), ("u8", "TYPE_UINT8"), ("i8", "TYPE_INT8"), ("i16", "TYPE_INT16"),
         ("i32", "TYPE_INT32"), ("i64", "TYPE_INT64"), ("f16", "TYPE_FP16"),
         ("f32", "TYPE_FP32"), ("f64", "TYPE_FP64")]
# Inputs `<name>__<index>`, listed in the config in reverse order.
ALL_TYPES = 'backend: "pytorch"\nmax_batch_size: 4\n' + io(
    [tensor(f"{n}__{i}", t, "3") for i, (n, t) in reversed(list(enumerate(TYPES)))],
    [tensor(f"OUT__{i}", t, "3") for i, (_, t) in enumerate(TYPES)])

UPPER = 'backend: "pytorch"\n' + io([tensor("text", "TYPE_STRING", "-1")],
                                    [tensor("OUTPUT__0", "TYPE_STRING", "-1")])
UPPER_BATCHED = 'backend: "pytorch"\nmax_batch_size: 4\ndynamic_batching {}\n' + io(
    [tensor("text", "TYPE_STRING", "1", "reshape: { shape: [ ] } ")],
    [tensor("OUTPUT__0", "TYPE_STRING", "1", "reshape: { shape: [ ] } ")])

DICT_SUM = ('backend: "pytorch"\ndefault_model_filename: "summing.pt"\nmax_batch_size: 4\n'
            + io([tensor("B", "TYPE_INT64", "2"), tensor("A", "TYPE_INT64", "2")],
                 [tensor("SUM__0", "TYPE_INT64", "2")]))

ORDERED = 'backend: "pytorch"\n' + io(
    [tensor("first", "TYPE_FP32", "2"), tensor("second", "TYPE_FP32", "2")],
    [tensor("combined", "TYPE_FP32", "2"), tensor("difference", "TYPE_FP32", "2")])


def flag_config(inference_mode: str | None) -> str:
    parameter = (f'parameters {{ key: "INFERENCE_MODE" value: {{ string_value: '
                 f'"{inference_mode}" }} }}\n' if inference_mode is not None else "")
    return 'backend: "pytorch"\nmax_batch_size: 4\n' + parameter + io(
        [tensor("x__0", "TYPE_FP32", "1")], [tensor("y__0", "TYPE_BOOL", "1")])


THREADS = """backend: "pytorch"
max_batch_size: 4
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value: { string_value: "true" } }
parameters { key: "ENABLE_CACHE_CLEANING" value: { string_value: "on" } }
""" + io([tensor("x__0", "TYPE_FP32", "1")], [tensor("y__0", "TYPE_BOOL", "1")])

SHARED_CORES = 'backend: "pytorch"\nmax_batch_size: 4\ninstance_group [ { count: 2 } ]\n' + io(
    [tensor("x__0", "TYPE_FP32", "1")], [tensor("y__0", "TYPE_BOOL", "1")])

AS_DOUBLE = 'backend: "pytorch"\nmax_batch_size: 4\n' + io(
    [tensor("x__0", "TYPE_FP32", "2")], [tensor("y__0", "TYPE_FP32", "2")])

PROJECT = 'backend: "pytorch"\nmax_batch_size: 4\n' + io(
    [tensor("x__0", "TYPE_FP32", "-1")], [tensor("y__0", "TYPE_FP32", "2")])

ACCUMULATE = """backend: "pytorch"
max_batch_size: 4
sequence_batching {
  state [ { input_name: "STATE_IN__1" output_name: "STATE_OUT__1" data_type: TYPE_INT32
            dims: [ 1 ] } ]
}
""" + io([tensor("INPUT__0", "TYPE_INT32", "1")], [tensor("OUTPUT__0", "TYPE_INT32", "1")])

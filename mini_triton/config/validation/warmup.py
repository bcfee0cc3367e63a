"""Triton's `model_warmup` rules: whether each sample fits the model it warms up.

A sample that does not fit is a load error naming the sample and the input,
before any instance starts:

- not for ensembles (they have no instance to warm up);
- `batch_size` at most `max_batch_size`, and 1 for a model that does not
  batch (0 skips the sample, as Triton does);
- every input is an input of the model or one of its sequence control
  inputs, with the model's data type and a full shape (no -1) that the
  model's `dims` accept; every required input of the model is given;
- each input says how its data is made: `zero_data`, `random_data` or
  `input_data_file`.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .rules import broken
from .sequence import inside_folder


def samples_fit_the_model(config: mc.ModelConfig) -> None:
    """Each sample's batch size, inputs and data fit the model (an ensemble has no
    warmup: the ensemble rules refuse it first)."""
    if not config.model_warmup or config.platform == "ensemble":
        return
    known = _known_inputs(config)
    for index, sample in enumerate(config.model_warmup):
        _check_batch_size(config, index, sample)
        for name in sorted(sample.inputs):
            _check_input(config, index, sample, name, known)
        _check_required(config, index, sample)


def sample_label(sample: mc.ModelWarmup) -> str:
    return f"warmup sample '{sample.name}'"


def _at(path: tuple, message: str):
    return broken(message, *path)


def _known_inputs(config: mc.ModelConfig) -> dict:
    """Input name → (data type, dims) a sample may give it; None dims: any shape."""
    known = {tensor.name: (tensor.data_type, list(tensor.dims)) for tensor in config.input}
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            data_type = control.data_type
            if not data_type:
                data_type = (mc.TYPE_INT32 if control.int32_false_true else
                             mc.TYPE_FP32 if control.fp32_false_true else mc.TYPE_BOOL)
            known.setdefault(control_input.name, (data_type, [1]))
    return known


def _check_batch_size(config, index: int, sample) -> None:
    label = sample_label(sample)
    path = ("model_warmup", index, "batch_size")
    if config.max_batch_size == 0 and sample.batch_size > 1:
        raise _at(path, (
            f"{label} has batch_size {sample.batch_size}, but model '{config.name}' does not "
            "batch (max_batch_size 0): its samples must have batch_size 1"))
    if config.max_batch_size and sample.batch_size > config.max_batch_size:
        raise _at(path, (
            f"{label} has batch_size {sample.batch_size}, more than the max_batch_size "
            f"{config.max_batch_size} of model '{config.name}'"))


def _check_input(config, index: int, sample, name: str, known: dict) -> None:
    label = sample_label(sample)
    spec = sample.inputs[name]
    path = ("model_warmup", index, "inputs", name)
    if name not in known:
        raise _at(path, (
            f"{label} gives input '{name}', which model '{config.name}' does not have "
            f"(its inputs: {', '.join(sorted(known)) or 'none'})"))
    data_type, dims = known[name]
    if spec.data_type != data_type:
        raise _at(path + ("data_type",), (
            f"{label} gives input '{name}' as {mc.DataType.Name(spec.data_type)}, but model "
            f"'{config.name}' expects {mc.DataType.Name(data_type)}"))
    shape = list(spec.dims)
    if any(d <= 0 for d in shape):
        raise _at(path + ("dims",), (
            f"{label}: warmup setting expects all variable-size dimensions are specified for "
            f"input '{name}'"))  # the sample named, then Triton's words
    if len(shape) != len(dims) or any(want not in (-1, got) for want, got in zip(dims, shape)):
        raise _at(path + ("dims",), (
            f"{label} gives input '{name}' the shape {shape}, which model '{config.name}' does "
            f"not accept (dims {dims})"))
    if spec.WhichOneof("input_data_type") is None:
        raise _at(path, (
            f"{label}: warmup setting expects input '{name}' to have input_data_type set"))
    if spec.HasField("input_data_file") and not inside_folder(spec.input_data_file):
        raise _at(path + ("input_data_file",), (
            f"{label}: input_data_file '{spec.input_data_file}' of input '{name}' must be the "
            "path of a file inside the model's 'warmup' folder"))


def _check_required(config, index: int, sample) -> None:
    missing = [t.name for t in config.input if not t.optional and t.name not in sample.inputs]
    if missing:
        raise _at(("model_warmup", index), (
            f"{sample_label(sample)} does not give the input(s) "
            f"{', '.join(repr(m) for m in missing)} that model '{config.name}' requires"))


RULES = (samples_fit_the_model,)

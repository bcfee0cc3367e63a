"""An ONNX model's inputs and outputs, and the config checked against them.

Pure functions over `Signature` (names, datatypes and dims as onnxruntime
reports them): Triton's ONNX auto-complete (`auto_complete`), and the checks
that a config agrees with the model (`check_against_model`), with Triton's
messages. Nothing here needs a session, so tests build signatures by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import TritonError, invalid_arg
from ...core.batch_inputs import batch_input_names
from ..model_checks import (check_datatype, compare_dims, configured_dims, find_tensor,
                            format_dims, type_name)

# onnxruntime's type strings → ModelConfig datatypes. BF16 is left out: the
# Python API cannot hand a bfloat16 output back as a numpy array.
ONNX_TO_CONFIG = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
}

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's `default-max-batch-size` for this backend


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output: `dims` hold -1 where the model leaves a dim free."""

    name: str
    onnx_type: str
    dims: tuple[int, ...]

    @property
    def data_type(self) -> int:
        """The ModelConfig datatype, TYPE_INVALID when the server cannot carry it."""
        return ONNX_TO_CONFIG.get(self.onnx_type, mc.TYPE_INVALID)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    def input(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorInfo | None:
        return next((t for t in self.outputs if t.name == name), None)

    @property
    def can_batch(self) -> bool:
        """Triton's rule: every input and output has a free first dim."""
        return all(t.dims and t.dims[0] == -1 for t in self.inputs + self.outputs)


def model_dims(shape) -> tuple[int, ...]:
    """onnxruntime's shape (ints, symbolic names, None) → dims with -1 for free ones."""
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (shape or ()))


def signature_of(session) -> Signature:
    """The signature of an `onnxruntime.InferenceSession`."""
    def infos(args):
        return tuple(TensorInfo(a.name, a.type, model_dims(a.shape)) for a in args)

    return Signature(infos(session.get_inputs()), infos(session.get_outputs()))


# --- names the config gives to tensors that are not request inputs/outputs ---


def state_inputs(config: mc.ModelConfig) -> list[str]:
    return [s.input_name for s in config.sequence_batching.state]


def state_outputs(config: mc.ModelConfig) -> list[str]:
    return [s.output_name for s in config.sequence_batching.state]


def control_inputs(config: mc.ModelConfig) -> list[str]:
    return [c.name for c in config.sequence_batching.control_input]


def batch_inputs(config: mc.ModelConfig) -> list[str]:
    """The model inputs made from the batch (`batch_input` targets), once each."""
    return list(dict.fromkeys(batch_input_names(config)))


# --- auto-complete ---


def auto_complete(config: mc.ModelConfig, signature: Signature,
                  default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
    """Complete `config` from the model as Triton's ONNX backend does.

    A config that lists both inputs and outputs is left as it is. Otherwise
    `max_batch_size` is set to the default where the model can batch (with
    `dynamic_batching {}` when it exceeds 1), and the inputs and outputs the
    config leaves out are filled from the model.
    """
    if config.input and config.output:
        return
    _complete_max_batch(config, signature, default_max_batch_size)
    skip_inputs = set(state_inputs(config)) | set(control_inputs(config)) | set(
        batch_inputs(config))
    _fill_missing(config, config.input, signature.inputs, skip_inputs)
    _fill_missing(config, config.output, signature.outputs, set(state_outputs(config)))


def _complete_max_batch(config: mc.ModelConfig, signature: Signature, default: int) -> None:
    if not signature.can_batch:
        if config.max_batch_size != 0:
            raise invalid_arg(
                f"autofill failed for model '{config.name}': model does not support batching "
                "while non-zero max_batch_size is specified")
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default, 0)
    if (config.max_batch_size > 1 and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")):
        config.dynamic_batching.SetInParent()


def _fill_missing(config: mc.ModelConfig, tensors, infos, skip: set[str]) -> None:
    present = {t.name for t in tensors}
    for info in infos:
        if info.name in present or info.name in skip:
            continue
        if info.data_type == mc.TYPE_INVALID:
            raise _unsupported(config.name, info)
        tensor = tensors.add()
        tensor.name = info.name
        tensor.data_type = info.data_type
        dims = info.dims[1:] if config.max_batch_size > 0 else info.dims
        if dims:
            tensor.dims.extend(dims)
        else:  # a scalar per batch row: config dims [1], the model sees no dim
            tensor.dims.append(1)
            if config.max_batch_size > 0:
                tensor.reshape.SetInParent()


def _unsupported(model: str, info: TensorInfo) -> TritonError:
    return invalid_arg(
        f"unable to load model '{model}', tensor '{info.name}' has type {info.onnx_type}, "
        "which this server cannot carry")


# --- config against model ---


def check_against_model(config: mc.ModelConfig, signature: Signature) -> None:
    """Raise INVALID_ARG, naming the tensor, where the config and the model disagree."""
    _check_batch_inputs(config, signature)
    _check_input_count(config, signature)
    for tensor in config.input:
        info = find_tensor(signature.inputs, tensor.name, "input", config.name)
        if tensor.optional and config.max_batch_size != 0:
            raise invalid_arg(
                f"unable to load model '{config.name}', optional input '{tensor.name}' is not "
                "supported for models that support batching")
        _check_tensor(config, tensor, info, "input")
    scattered = {name for b in config.batch_output for name in b.target_name}
    for tensor in config.output:
        info = find_tensor(signature.outputs, tensor.name, "output", config.name)
        if tensor.name in scattered:  # the model's whole-batch tensor, cut up afterwards
            check_datatype(config.name, "output", tensor, info.data_type)
            continue
        _check_tensor(config, tensor, info, "output")
    _check_states(config, signature)


def _check_batch_inputs(config: mc.ModelConfig, signature: Signature) -> None:
    for batch_input in config.batch_input:
        for name in batch_input.target_name:
            info = signature.input(name)
            if info is None:
                raise invalid_arg(
                    f"unable to load model '{config.name}', batch input '{name}' is not an "
                    "input of the model")
            if info.data_type != batch_input.data_type:
                raise invalid_arg(
                    f"unable to load model '{config.name}', configuration expects datatype "
                    f"{type_name(batch_input.data_type)} for batch input '{name}', model "
                    f"provides {type_name(info.data_type)}")


def _check_input_count(config: mc.ModelConfig, signature: Signature) -> None:
    expected = (sum(1 for t in config.input if not t.optional) + len(state_inputs(config))
                + len(control_inputs(config)) + len(batch_inputs(config)))
    provided = len(signature.inputs)
    optional = sum(1 for t in config.input if t.optional)
    if not expected <= provided <= expected + optional:
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects {expected} inputs, "
            f"model provides {provided}")


def _check_tensor(config: mc.ModelConfig, tensor, info: TensorInfo, kind: str) -> None:
    if info.data_type == mc.TYPE_INVALID:
        raise _unsupported(config.name, info)
    check_datatype(config.name, kind, tensor, info.data_type)
    dims = configured_dims(tensor)
    if getattr(tensor, "allow_ragged_batch", False):
        if info.dims != (-1,):
            raise invalid_arg(
                f"unable to load model '{config.name}', configuration expects model provides "
                f"input with shape [-1] for ragged input '{tensor.name}', model provides "
                f"{format_dims(info.dims)}")
        return
    if not info.dims and config.max_batch_size == 0:
        if any(d != 1 for d in dims):
            raise invalid_arg(
                f"unable to load model '{config.name}', scalar tensor '{tensor.name}', should "
                "only provide 1 in the model configuration when the model doesn't support "
                f"batching. Model configuration provided: {format_dims(dims)}.")
        return
    compare_dims(config.name, tensor.name, info.dims, dims, config.max_batch_size)


def _check_states(config: mc.ModelConfig, signature: Signature) -> None:
    for state in config.sequence_batching.state:
        for name, info in ((state.input_name, signature.input(state.input_name)),
                           (state.output_name, signature.output(state.output_name))):
            if info is None:
                raise invalid_arg(
                    f"unable to load model '{config.name}', sequence state '{name}' is not "
                    "a tensor of the model")
            if info.data_type != state.data_type:
                raise invalid_arg(
                    f"unable to load model '{config.name}', configuration expects datatype "
                    f"{type_name(state.data_type)} for state '{name}', model provides "
                    f"{type_name(info.data_type)}")
            compare_dims(config.name, name, info.dims, state.dims, config.max_batch_size)
    for control in config.sequence_batching.control_input:
        if signature.input(control.name) is None:
            raise invalid_arg(
                f"configuration specified sequence control '{control.name}', but model does "
                "not provide that input")

"""Reading an OpenVINO model for a config and compiling it for one instance, as
Triton's OpenVINO backend does: the IR (`model.xml` with its `model.bin`) or any
file OpenVINO reads (`default_model_filename: "model.onnx"`), tensor types set
from the config, the batch dim from `max_batch_size`, and the CPU properties from
`parameters`.

The batch dim differs on purpose: Triton fixes it at max_batch_size, so a batch
of any other size is an error unless ENABLE_BATCH_PADDING pads it; here it is
dynamic (1..max_batch_size) and every batch runs as it is.
SKIP_OV_DYNAMIC_BATCHSIZE: YES asks for Triton's fixed batch dim (for a model
that cannot take a dynamic one), with its error and its padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import invalid_arg, unavailable
from .signature import CONFIG_TO_OV, Signature, TensorInfo

log = logging.getLogger("mini_triton.backends.openvino")

DEVICE = "CPU"
# The CPU properties Triton passes from `parameters` to OpenVINO.
CPU_PROPERTIES = ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16",
                  "NUM_STREAMS", "PERFORMANCE_HINT")


@dataclass(frozen=True)
class OpenVinoSettings:
    skip_dynamic_batch_size: bool = False
    enable_batch_padding: bool = False
    reshape_io_layers: bool = False
    cpu_extension_path: str = ""
    properties: dict = field(default_factory=dict)  # OpenVINO CPU properties


def read_settings(config: mc.ModelConfig) -> OpenVinoSettings:
    properties = {}
    for key in CPU_PROPERTIES:
        value = config.parameters[key].string_value if key in config.parameters else ""
        if value:
            name = "INFERENCE_PRECISION_HINT" if key == "HINT_BF16" else key
            properties[name] = cpu_property(key, value.lower())
    return OpenVinoSettings(
        skip_dynamic_batch_size=_yes(config, "SKIP_OV_DYNAMIC_BATCHSIZE"),
        enable_batch_padding=_yes(config, "ENABLE_BATCH_PADDING"),
        reshape_io_layers=_yes(config, "RESHAPE_IO_LAYERS"),
        cpu_extension_path=(config.parameters["CPU_EXTENSION_PATH"].string_value
                            if "CPU_EXTENSION_PATH" in config.parameters else ""),
        properties=properties)


def cpu_property(key: str, value: str):
    """A parameter's OpenVINO property value, with Triton's messages for bad ones."""
    if key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
        if not value.isdigit():
            raise invalid_arg(f"expected the parameter '{key}' to be a non-negative number, "
                              f"got {value}")
        return int(value)
    if key == "HINT_BF16":
        if value != "yes":
            raise invalid_arg(f"expected the parameter '{key}' to be YES, got {value}")
        return "bf16"  # the INFERENCE_PRECISION_HINT it stands for
    if key == "NUM_STREAMS":
        if value in ("auto", "numa"):
            return value.upper()
        if not value.isdigit():
            raise invalid_arg(f"expected the parameter '{key}' to be either "
                              f"AUTO/NUMA/<int_value>, got {value}")
        return int(value)
    if value not in ("latency", "throughput", "cumulative_throughput"):
        raise invalid_arg(f"expected the parameter '{key}' to be "
                          f"LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got {value}")
    return value.upper()


def _yes(config: mc.ModelConfig, key: str) -> bool:
    return key in config.parameters and config.parameters[key].string_value.lower() == "yes"


def model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    path = version_dir / (config.default_model_filename or "model.xml")
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model '{config.name}'")
    return path


def new_core(config: mc.ModelConfig, settings: OpenVinoSettings) -> ov.Core:
    core = ov.Core()
    if settings.cpu_extension_path:
        try:
            core.add_extension(settings.cpu_extension_path)
        except RuntimeError as error:
            raise unavailable(f"model '{config.name}': loading custom CPU extensions "
                              f"'{settings.cpu_extension_path}': {first_line(error)}") from None
    return core


def read_model(core: ov.Core, config: mc.ModelConfig, path: Path) -> ov.Model:
    try:
        return core.read_model(str(path))
    except RuntimeError as error:
        expected = ("an OpenVINO IR: model.xml with its weights in "
                    f"'{path.with_suffix('.bin').name}' beside it"
                    if path.suffix == ".xml" else "a model OpenVINO can read")
        raise unavailable(f"unable to load model '{config.name}': OpenVINO could not read "
                          f"'{path}' as {expected}: {first_line(error)}") from None


def signature_of(model: ov.Model) -> Signature:
    def info(port) -> TensorInfo:
        shape = port.get_partial_shape()
        dims = tuple(d.get_length() if d.is_static else -1 for d in shape) \
            if shape.rank.is_static else ()
        layout = ov.layout_helpers.get_layout(port)
        return TensorInfo(port.get_any_name(), port.get_element_type().get_type_name(),
                          dims, ov.layout_helpers.has_batch(layout))

    return Signature(tuple(info(p) for p in model.inputs), tuple(info(p) for p in model.outputs))


def prepare(model: ov.Model, config: mc.ModelConfig, settings: OpenVinoSettings) -> ov.Model:
    """The model with the config's tensor types, RESHAPE_IO_LAYERS' shapes and the
    batch dim set from max_batch_size."""
    ppp = ov.preprocess.PrePostProcessor(model)
    for tensor in config.input:
        port = ppp.input(tensor.name).tensor()
        port.set_element_type(_element(tensor.data_type))
        if config.max_batch_size > 0:
            port.set_layout(ov.Layout("N..."))
    for tensor in config.output:
        ppp.output(tensor.name).tensor().set_element_type(
            _element(tensor.data_type))
    try:
        model = ppp.build()
        if settings.reshape_io_layers:
            model.reshape({t.name: _configured_shape(config, t) for t in config.input})
        if config.max_batch_size > 0:
            batch = (config.max_batch_size if settings.skip_dynamic_batch_size
                     else ov.Dimension(1, config.max_batch_size))
            ov.set_batch(model, batch)
    except RuntimeError as error:
        raise invalid_arg(f"unable to load model '{config.name}': OpenVINO could not give "
                          f"it the configured shapes: {first_line(error)}") from None
    return model


def _configured_shape(config: mc.ModelConfig, tensor) -> ov.PartialShape:
    dims = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)
    if any(d < -1 or d == 0 for d in dims):
        raise invalid_arg("openvino backend does not support dimensions values other than "
                          "`-1` or positive integers")
    batch = (-1,) if config.max_batch_size > 0 else ()
    return ov.PartialShape([ov.Dimension(d) for d in batch + dims])


def supported_properties(core: ov.Core, config: mc.ModelConfig, properties: dict) -> dict:
    """The properties this OpenVINO's CPU plugin has; each other one named in a warning
    (OpenVINO 2025 dropped COMPILATION_NUM_THREADS from the CPU plugin, which refuses
    to compile with a property it does not have)."""
    supported = {str(name) for name in core.get_property(DEVICE, "SUPPORTED_PROPERTIES")}
    for name in sorted(set(properties) - supported):
        log.warning("model '%s': parameter %s is not applied: the CPU plugin of OpenVINO "
                    "%s has no such property", config.name, name, ov.get_version())
    return {name: value for name, value in properties.items() if name in supported}


def compile_model(core: ov.Core, model: ov.Model, config: mc.ModelConfig,
                  properties: dict) -> ov.CompiledModel:
    try:
        return core.compile_model(model, DEVICE, properties)
    except RuntimeError as error:
        raise unavailable(f"unable to load model '{config.name}': OpenVINO could not "
                          f"compile it for the CPU: {first_line(error)}") from None


def first_line(error: Exception) -> str:
    """OpenVINO's message without the source locations it starts with."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Exception from", "Check '"))]
    return (useful or lines or [type(error).__name__])[0]


def _element(data_type: int) -> ov.Type:
    return getattr(ov.Type, CONFIG_TO_OV[data_type])

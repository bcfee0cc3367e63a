"""Building a TensorRT plan from an ONNX model (needs TensorRT and a GPU).

Used by `perf/build_trt_engine.py` and the GPU tests. Every dynamic input dim
needs bounds: the batch dim (dim 0) gets 1..max_batch_size unless `shapes`
says otherwise; any other dynamic dim must be given in `shapes`.
"""

from __future__ import annotations

from ...core.errors import invalid_arg
from . import runtime as runtimes

ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # min, opt, max


def default_profile(shape: tuple[int, ...], max_batch_size: int) -> ShapeRange:
    """Bounds for an input whose only dynamic dim is the batch dim."""
    if any(d < 0 for d in shape[1:]):
        raise invalid_arg(f"input shape {list(shape)} has dynamic dims beyond the batch dim; "
                          "give its min/opt/max shapes")
    if not shape or shape[0] >= 0:
        return tuple(shape), tuple(shape), tuple(shape)
    rest = tuple(shape[1:])
    return (1,) + rest, (max(1, max_batch_size // 2),) + rest, (max_batch_size,) + rest


def build_plan(onnx_bytes: bytes, max_batch_size: int = 8,
               shapes: dict[str, ShapeRange] | None = None, fp16: bool = False,
               workspace_bytes: int = 1 << 30) -> bytes:
    """Parse the ONNX model, add one optimisation profile, return the serialized plan."""
    runtime = runtimes.require()
    trt = runtime.trt
    with runtimes.on_device(runtime, 0):
        logger = runtimes.logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_bytes):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise invalid_arg(f"TensorRT could not parse the ONNX model: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
        if fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        profile = builder.create_optimization_profile()
        for index in range(network.num_inputs):
            tensor = network.get_input(index)
            bounds = (shapes or {}).get(tensor.name) or default_profile(
                tuple(tensor.shape), max_batch_size)
            profile.set_shape(tensor.name, *bounds)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise invalid_arg("TensorRT failed to build the engine (see its log above)")
        return bytes(plan)

"""ValidateModelConfig's checks of the model as a whole: its name, platform and
backend, max_batch_size, version policy and response cache."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .rules import broken

ENSEMBLE = "ensemble"

# Triton's BackendType: the backends that pin a platform, and the platforms of each.
# A backend not listed here (python, identity, a custom one) takes any platform.
_BACKEND_TYPE = {"tensorflow": "tensorflow", "tensorrt": "tensorrt",
                 "onnxruntime": "onnxruntime", "pytorch": "pytorch"}
_PLATFORM_TYPE = {"tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow",
                  "tensorrt_plan": "tensorrt", "onnxruntime_onnx": "onnxruntime",
                  "pytorch_libtorch": "pytorch", "torch_aoti": "pytorch"}


def name_is_given(config: mc.ModelConfig) -> None:
    if not config.name:
        raise broken("model configuration must specify 'name'", "name")


def backend_is_given_unless_ensemble(config: mc.ModelConfig) -> None:
    """Only an ensemble has no backend, and an ensemble has none."""
    if not config.backend and config.platform != ENSEMBLE:
        raise broken(f"unexpected platform type '{config.platform}' for {config.name}",
                     "platform")
    if config.backend and config.platform == ENSEMBLE:
        raise broken(f"Ensemble model '{config.name}' must have platform type "
                     f"'{config.platform}' and empty backend type", "backend")


def platform_matches_backend(config: mc.ModelConfig) -> None:
    backend_type = _BACKEND_TYPE.get(config.backend)
    if backend_type is not None and backend_type != _PLATFORM_TYPE.get(config.platform):
        raise broken(f"unexpected 'platform' and 'backend' pair, got:{config.platform}, "
                     f"{config.backend}", "platform")


def max_batch_size_non_negative(config: mc.ModelConfig) -> None:
    if config.max_batch_size < 0:
        raise broken(f"'max_batch_size' must be non-negative value for {config.name}",
                     "max_batch_size")


def version_policy_is_given(config: mc.ModelConfig) -> None:
    """Always true once normalised (a missing policy becomes `latest { num_versions: 1 }`)."""
    if not config.HasField("version_policy"):
        raise broken(f"must specify 'version policy' for {config.name}", "version_policy")


def no_cache_for_sequences(config: mc.ModelConfig) -> None:
    if config.HasField("sequence_batching") and config.response_cache.enable:
        raise broken(f"Response Cache does not currently support model {config.name} with "
                     "sequence batching scheduler. Please disable the response cache.",
                     "response_cache")


def no_cache_for_decoupled(config: mc.ModelConfig) -> None:
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise broken(f"Response Cache does not currently support model {config.name} with "
                     "'decoupled' transaction policy. Please disable the response cache.",
                     "response_cache")


IDENTITY_RULES = (name_is_given, backend_is_given_unless_ensemble, platform_matches_backend,
                  max_batch_size_non_negative, version_policy_is_given)
# Triton checks the cache with the sequence batcher before the sequence controls, and
# with a decoupled model last of all.
SEQUENCE_CACHE_RULES = (no_cache_for_sequences,)
CACHE_RULES = (no_cache_for_decoupled,)

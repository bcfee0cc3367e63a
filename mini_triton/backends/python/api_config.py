"""`triton_python_backend_utils` lookups by name and the `ModelConfig` a model's
`auto_complete_config` edits."""

from __future__ import annotations

import json

from .api_core import _current_host

# --- lookups ---


def get_input_tensor_by_name(inference_request, name):
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config, kind: str, name: str):
    for entry in model_config.get(kind, []):
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config, name):
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config, name):
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config):
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_model_dir():
    """The model's version folder (where model.py lives)."""
    return _current_host().model_dir()


# --- auto-complete ---


def _spoken_list(names: tuple) -> str:
    """'a', 'b' and 'c': the list as Triton's messages write it."""
    quoted = [f"'{name}'" for name in names]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


class ModelConfig:
    """The config handed to `auto_complete_config`; the model may set max_batch_size,
    dynamic batching, inputs, outputs and the transaction policy."""

    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config):
        self._model_config = json.loads(model_config) if isinstance(model_config, (str, bytes)) \
            else model_config
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return self._model_config.get("name", "")

    def as_dict(self):
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input):
        self._add_tensor("input", input, self._INPUT_KEYS)

    def add_output(self, output):
        self._add_tensor("output", output, self._OUTPUT_KEYS)

    def _add_tensor(self, kind: str, tensor: dict, allowed: tuple) -> None:
        label = tensor.get("name", "")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            raise ValueError(
                f"{kind} '{label}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {_spoken_list(allowed)}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{label}' in auto-complete-config function for model "
                                 f"'{self._name}' is missing '{key}' property.")
        for existing in self._model_config[kind]:
            if existing.get("name") == label:
                self._merge_tensor(kind, existing, tensor)
                return
        self._model_config[kind].append(tensor)

    def _merge_tensor(self, kind: str, existing: dict, tensor: dict) -> None:
        label = tensor["name"]
        current_type = existing.get("data_type", "TYPE_INVALID")
        if current_type not in ("TYPE_INVALID", tensor["data_type"]):
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{current_type} for {kind} '{label}', model provides {tensor['data_type']}")
        if existing.get("dims") and list(existing["dims"]) != list(tensor["dims"]):
            raise ValueError(
                f"model '{self._name}', tensor '{label}': the model expects dims "
                f"{list(tensor['dims'])} but the model configuration specifies dims "
                f"{list(existing['dims'])}")
        if "optional" in tensor and "optional" in existing \
                and existing["optional"] != tensor["optional"]:
            raise ValueError(
                f"model '{self._name}', tensor '{label}': the model expects optional "
                f"{tensor['optional']} but the model configuration specifies optional "
                f"{existing['optional']}")
        existing.update(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict):
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted

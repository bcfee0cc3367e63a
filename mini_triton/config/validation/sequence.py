"""The sequence batcher's rules: control inputs (ValidateModelConfig, through
Triton's Get*SequenceControlProperties) and implicit state with its
initial_state (the sequence batch scheduler's checks)."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .rules import broken

_Kind = mc.ModelSequenceBatching.Control.Kind
_BOOLEAN_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
_CORRID = "CONTROL_SEQUENCE_CORRID"
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING)
_VALUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")

INITIAL_STATE_FOLDER = "initial_state"


# --- control inputs ---


def _controls_of_kind(config: mc.ModelConfig, kind_name: str):
    """Yield (path, control) for every control of one kind, after Triton's checks of
    the control tensors' names, which it repeats for each kind."""
    kind = _Kind.Value(kind_name)
    seen_names: set[str] = set()
    seen_kind = False
    for index, control_input in enumerate(config.sequence_batching.control_input):
        path = ("sequence_batching", "control_input", index)
        if not control_input.name:
            raise broken("sequence batching control tensor must have a name for "
                         f"{config.name}", *path)
        if control_input.name in seen_names:
            raise broken(f"sequence batching control tensor '{control_input.name}' is "
                         f"specified for multiple control kinds for {config.name}",
                         *path, "name")
        seen_names.add(control_input.name)
        for position, control in enumerate(control_input.control):
            if control.kind != kind:
                continue
            if seen_kind:
                raise broken(f"sequence batching specifies multiple {kind_name} tensors for "
                             f"{config.name}", *path, "control", position, "kind")
            seen_kind = True
            yield path + ("control", position), control


def _boolean_control(config: mc.ModelConfig, kind_name: str) -> None:
    for path, control in _controls_of_kind(config, kind_name):
        given = [field for field in _VALUE_FIELDS if len(getattr(control, field))]
        if not given:
            raise broken("sequence batching must specify either 'int32_false_true', "
                         f"'fp32_false_true' or 'bool_false_true' for {kind_name} for "
                         f"{config.name}", *path)
        if len(given) > 1:
            raise broken("sequence batching specifies more than one from 'int32_false_true', "
                         f"'fp32_false_true' and 'bool_false_true' for {kind_name} for "
                         f"{config.name}", *path, given[1])
        if len(getattr(control, given[0])) != 2:
            raise broken(f"sequence batching control '{given[0]}' must have exactly 2 entries "
                         f"for {kind_name} for {config.name}", *path, given[0])


def start_control(config: mc.ModelConfig) -> None:
    _boolean_control(config, "CONTROL_SEQUENCE_START")


def end_control(config: mc.ModelConfig) -> None:
    _boolean_control(config, "CONTROL_SEQUENCE_END")


def ready_control(config: mc.ModelConfig) -> None:
    _boolean_control(config, "CONTROL_SEQUENCE_READY")


def correlation_id_control(config: mc.ModelConfig) -> None:
    """CORRID carries the id in its `data_type`, never in false/true values."""
    found = None
    for path, control in _controls_of_kind(config, _CORRID):
        if any(len(getattr(control, field)) for field in _VALUE_FIELDS):
            raise broken("sequence batching must not specify either 'int32_false_true', "
                         f"'fp32_false_true' or 'bool_false_true' for {_CORRID} for "
                         f"{config.name}", *path)
        found = path, control
    if found is not None:
        path, control = found
        if control.data_type not in _CORRID_TYPES:
            raise broken(f"unexpected data type for control {_CORRID} for {config.name}. "
                         "Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                         "TYPE_INT32 and TYPE_STRING", *path, "data_type")


# --- implicit state ---


def _states_with_initial(config: mc.ModelConfig):
    for index, state in enumerate(config.sequence_batching.state):
        path = ("sequence_batching", "state", index)
        if len(state.initial_state) > 1:
            raise broken(f"initial_state field for state input '{state.input_name}' must "
                         "contain exactly one or zero element. Found "
                         f"'{len(state.initial_state)}' elements.", *path, "initial_state", 1)
        if state.initial_state:
            yield path + ("initial_state", 0), state, state.initial_state[0]


def initial_state_matches_state(config: mc.ModelConfig) -> None:
    """Each initial_state has the state's type, a name, the state's rank and a full
    shape that the state's dims accept; one initial_state per state input."""
    seen: set[str] = set()
    for path, state, initial in _states_with_initial(config):
        name = state.input_name
        if initial.data_type != state.data_type:
            raise broken(f"The data type used for 'initial_state' field of state '{name}' "
                         "does not match the state data type.", *path, "data_type")
        if not initial.name:
            raise broken("Field 'name' must be set when using initial_state for state input "
                         f"'{name}'.", *path)
        if name in seen:
            raise broken(f"State input name '{name}' specified more than once.",
                         *path[:-2], "input_name")
        seen.add(name)
        _initial_dims_match(path, state, initial)


def _initial_dims_match(path: tuple, state, initial) -> None:
    name = state.input_name
    if len(initial.dims) != len(state.dims):
        raise broken("Number of dimensions in 'initial_state' doesn't match the size of "
                     f"'state' dimensions for state input '{name}'. {len(initial.dims)} != "
                     f"{len(state.dims)}", *path, "dims")
    for given, described in zip(initial.dims, state.dims):
        if given == -1:
            raise broken(f"'initial_state' field for state input name '{name}' contains "
                         "variable dimensions.", *path, "dims")
        if described != -1 and given != described:
            raise broken(f"'initial_state' dim for input name '{name}' doesn't match 'state' "
                         f"dim description. {given} != {described}", *path, "dims")


def initial_state_has_data(config: mc.ModelConfig) -> None:
    for path, state, initial in _states_with_initial(config):
        kind = initial.WhichOneof("state_data")
        if kind is None:
            raise broken(f"initial_state setting expects state'{state.input_name}' to have "
                         "state_data set", *path)
        if kind == "data_file" and not inside_folder(initial.data_file):
            raise broken(f"initial_state data_file '{initial.data_file}' of state "
                         f"'{state.input_name}' must be the path of a file inside the "
                         f"model's '{INITIAL_STATE_FOLDER}' folder", *path, "data_file")


def inside_folder(name: str) -> bool:
    """A relative path that stays inside its folder (nothing climbs out), so a config
    cannot make the server read a file outside the model."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\\" not in name and "\0" not in name \
        and all(part not in ("", ".", "..") for part in parts)


CONTROL_RULES = (start_control, end_control, ready_control, correlation_id_control)
STATE_RULES = (initial_state_matches_state, initial_state_has_data)

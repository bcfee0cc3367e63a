"""ValidateModelConfig's checks of the batchers: dynamic batching (preferred
sizes, priority levels, queue policies, preserve_ordering) and the sequence
batcher's strategies (oldest, direct)."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .rules import broken

_DELAY = mc.ModelQueuePolicy.DELAY


def preferred_sizes_in_range(config: mc.ModelConfig) -> None:
    for index, size in enumerate(config.dynamic_batching.preferred_batch_size):
        if size <= 0:
            raise broken(f"dynamic batching preferred size must be positive for {config.name}",
                         "dynamic_batching", "preferred_batch_size", index)
        if size > config.max_batch_size:
            raise broken("dynamic batching preferred size must be <= max batch size for "
                         f"{config.name}", "dynamic_batching", "preferred_batch_size", index)


def default_priority_in_range(config: mc.ModelConfig) -> None:
    batching = config.dynamic_batching
    levels = batching.priority_levels
    if levels and not 1 <= batching.default_priority_level <= levels:
        raise broken(f"default priority level must be in range [1, {levels}] for "
                     f"{config.name}", "dynamic_batching", "default_priority_level")


def queue_policy_levels_in_range(config: mc.ModelConfig) -> None:
    batching = config.dynamic_batching
    levels = batching.priority_levels
    for level in sorted(batching.priority_queue_policy) if levels else ():
        if not 1 <= level <= levels:
            raise broken("priority queue policy must have priority level in range "
                         f"[1, {levels}] for {config.name}",
                         "dynamic_batching", "priority_queue_policy", level)


def ordering_with_one_priority(config: mc.ModelConfig) -> None:
    batching = config.dynamic_batching
    if batching.preserve_ordering and batching.priority_levels > 1:
        raise broken("Only one priority level is allowed when 'preserve_ordering' is true "
                     f"for {config.name}", "dynamic_batching", "priority_levels")


def ordering_without_delay(config: mc.ModelConfig) -> None:
    """A delayed request would overtake none and be overtaken: no DELAY action when
    responses must keep the requests' order."""
    batching = config.dynamic_batching
    if not batching.preserve_ordering:
        return
    policies = [(("default_queue_policy",), batching.default_queue_policy)]
    policies += [(("priority_queue_policy", level), batching.priority_queue_policy[level])
                 for level in sorted(batching.priority_queue_policy)]
    for path, policy in policies:
        if policy.default_timeout_microseconds and policy.timeout_action == _DELAY:
            raise broken("Queue policy can not have DELAY as timeout action when "
                         f"'preserve_ordering' is true for {config.name}",
                         "dynamic_batching", *path, "timeout_action")


def oldest_preferred_sizes_in_range(config: mc.ModelConfig) -> None:
    sequence = config.sequence_batching
    if not sequence.HasField("oldest"):
        return
    for index, size in enumerate(sequence.oldest.preferred_batch_size):
        path = ("sequence_batching", "oldest", "preferred_batch_size", index)
        if size <= 0:
            raise broken("sequence batching preferred batch size must be positive for "
                         f"{config.name}", *path)
        if size > config.max_batch_size:
            raise broken("sequence batching preferred batch size must be <= max batch size "
                         f"for {config.name}", *path)


def direct_slot_utilization_in_range(config: mc.ModelConfig) -> None:
    sequence = config.sequence_batching
    if not sequence.HasField("direct"):
        return
    if not 0.0 <= sequence.direct.minimum_slot_utilization <= 1.0:
        raise broken("sequence batching minimum slot utilization must be in range (0.0, 1.0] "
                     f"for {config.name}",
                     "sequence_batching", "direct", "minimum_slot_utilization")


DYNAMIC_RULES = (preferred_sizes_in_range, default_priority_in_range,
                 queue_policy_levels_in_range, ordering_with_one_priority,
                 ordering_without_delay)
SEQUENCE_STRATEGY_RULES = (oldest_preferred_sizes_in_range, direct_slot_utilization_in_range)

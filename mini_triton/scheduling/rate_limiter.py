"""The rate limiter (`--rate-limit=execution_count`): instances of all models compete
for named resources, and an instance executes only once its resources are free.

As in Triton (docs/user_guide/rate_limiter.md, core's rate_limiter.cc):

- an instance group's `rate_limiter { resources [...] priority: N }` says what
  each of its instances needs to execute; a resource is per device (the
  instance's device) unless `global`;
- a resource has as many copies as the largest count any loaded instance asks
  for, unless `--rate-limit-resource=NAME:COUNT[:DEVICE]` says otherwise (then
  a resource not given there has none, and an instance that needs more than
  there is fails its load);
- an instance waiting to execute is *staged*; staged instances are served in
  order of `executions × priority` (priority 0 counts as 1), so one of
  priority 2 gets half the executions of one of priority 1 under equal load;
  the first in that order waits for its resources and holds up the others
  (Triton's head-of-line allocation), so a big instance is not starved.

An instance whose group has no `rate_limiter` is not limited at all, as the
docs say. A batch is formed first and then waits for its resources, so that
time counts as queue time in the statistics. With `--rate-limit=off` (the
default) there is no limiter and schedulers pay nothing.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ..config.locate import field_error
from ..core.errors import TritonError, invalid_arg

log = logging.getLogger("mini_triton.scheduling")

GLOBAL = "global"
PER_DEVICE = -1  # --rate-limit-resource without a device: every device
MODES = ("off", "execution_count")


def parse_resource(text: str) -> tuple[str, int, int]:
    """`NAME:COUNT[:DEVICE]` → (name, count, device or PER_DEVICE); ValueError if bad."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--rate-limit-resource expects NAME:COUNT[:DEVICE], got '{text}'")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else PER_DEVICE
    except ValueError:
        raise ValueError(f"--rate-limit-resource expects NAME:COUNT[:DEVICE] with whole "
                         f"numbers, got '{text}'") from None
    if count < 0 or (len(parts) == 3 and device < 0):
        raise ValueError(f"--rate-limit-resource: count and device must be >= 0, got '{text}'")
    return parts[0], count, device


@dataclass(eq=False)
class Ticket:
    """One rate-limited instance: what it needs, and where it stands."""

    label: str  # "model version N instance I", for messages
    needs: dict  # (GLOBAL or device, resource name) -> count
    priority: int
    executions: int = 0
    staged_at: int = 0  # order of staging, to break ties
    state: str = "idle"  # idle, staged, allocated (resources taken), running

    def scaled_priority(self) -> tuple[int, int]:
        return self.executions * max(1, self.priority), self.staged_at


@dataclass(frozen=True)
class Gate:
    """A scheduler's hold on one instance's ticket."""

    limiter: "RateLimiter"
    ticket: Ticket

    def acquire(self) -> None:
        self.limiter.acquire(self.ticket)

    def release(self, again: bool) -> None:
        self.limiter.release(self.ticket, again)

    def withdraw(self) -> None:
        self.limiter.withdraw(self.ticket)


class RateLimiter:
    """One per server; schedulers acquire and release their instances' tickets."""

    def __init__(self, explicit: list[tuple[str, int, int]] | None = None):
        self.explicit: dict = {}
        for name, count, device in explicit or []:
            self.explicit[(device, name)] = count
        self.condition = threading.Condition()
        self.tickets: list[Ticket] = []
        self.limits: dict = {}  # (GLOBAL or device, name) -> copies
        self.taken: dict = {}
        self.staged: list[Ticket] = []
        self.order = itertools.count()

    # --- registration (model load and unload) ---

    def register(self, config: mc.ModelConfig, version: int, instance_count: int,
                 source=None) -> list[Ticket | None]:
        """Tickets for a version's instances (None where the group is not limited);
        INVALID_ARG, naming the place in config.pbtxt, if a resource cannot be had."""
        members = [(group, index) for _, group, index in _instances(config, instance_count)]
        return self.register_members(config, version, members, source)

    def register_members(self, config: mc.ModelConfig, version: int, members: list,
                         source=None) -> list[Ticket | None]:
        """As `register`, for the instances `members` names: (group, index in the group)
        each, as an instance-group update adds them to a serving version."""
        tickets = []
        for group, index_in_group in members:
            if not group.HasField("rate_limiter"):
                tickets.append(None)
                continue
            devices = list(group.gpus) or [0]
            device = devices[index_in_group % len(devices)]
            needs = {}
            for resource in group.rate_limiter.resources:
                key = (GLOBAL if getattr(resource, "global") else device, resource.name)
                needs[key] = max(needs.get(key, 0), resource.count)
            label = (f"model '{config.name}' version {version} instance "
                     f"'{group.name or config.name}_{index_in_group}'")
            tickets.append(Ticket(label, needs, group.rate_limiter.priority))
        limited = [t for t in tickets if t is not None]
        if not limited:
            return tickets
        with self.condition:
            trial = self.tickets + limited
            try:
                limits = self._limits(trial)
            except _ResourceError as error:
                raise _located(error, config, source) from None
            self.tickets, self.limits = trial, limits
        for _ in limited:  # Triton draws the map as each instance joins
            log.debug("%s", max_resource_map(limits))
        return tickets

    def unregister(self, tickets: list) -> None:
        gone = {id(t) for t in tickets if t is not None}
        if not gone:
            return
        with self.condition:
            before = self.limits
            self.tickets = [t for t in self.tickets if id(t) not in gone]
            self.staged = [t for t in self.staged if id(t) not in gone]
            self.limits = self._limits(self.tickets)
            self._allocate()
            self.condition.notify_all()
        for _ in gone:  # and again as each one leaves, still counting it
            log.debug("%s", max_resource_map(before))

    def _limits(self, tickets: list[Ticket]) -> dict:
        """The copies of each resource, by Triton's rules; _ResourceError if one is short
        or named both global and per device."""
        wanted: dict = {}
        for ticket in tickets:
            for key, count in ticket.needs.items():
                wanted[key] = max(wanted.get(key, 0), count)
        global_names = {name for where, name in wanted if where == GLOBAL}
        for where, name in wanted:
            if where != GLOBAL and name in global_names:
                raise _ResourceError(name, f'Resource "{name}" is present as both global and '
                                     "device-specific resource in the model configuration.")
        if not self.explicit:
            return wanted
        limits = {}
        for (where, name), needed in wanted.items():
            if where == GLOBAL:
                given = [c for (_, n), c in self.explicit.items() if n == name]
            else:
                given = [c for (d, n), c in self.explicit.items()
                         if n == name and d in (where, PER_DEVICE)]
            copies = max(given, default=0)
            if copies < needed:
                raise _ResourceError(name, (
                    f'Resource count for "{name}" is limited to {copies} which will prevent '
                    "scheduling of one or more model instances, the minimum required count "
                    f"is {needed}"))
            limits[(where, name)] = copies
        return limits

    # --- execution ---

    def acquire(self, ticket: Ticket) -> None:
        """Wait until `ticket`'s resources are taken for it (staging it if need be)."""
        with self.condition:
            if ticket.state == "idle":
                self._stage(ticket)
                self._allocate()
            while ticket.state != "allocated":
                self.condition.wait()
            ticket.state = "running"

    def release(self, ticket: Ticket, again: bool = False) -> None:
        """The execution is over: free its resources; `again`: the instance has more work
        waiting, so it is staged at once and competes for what it frees."""
        with self.condition:
            self._give_back(ticket)
            ticket.executions += 1
            if again:
                self._stage(ticket)
            self._allocate()
            self.condition.notify_all()

    def withdraw(self, ticket: Ticket) -> None:
        """The instance goes idle without executing (its work went elsewhere): leave the
        stage, or give back resources taken for it."""
        with self.condition:
            if ticket.state == "staged":
                self.staged.remove(ticket)
            elif ticket.state == "allocated":
                self._give_back(ticket)
            else:
                return
            ticket.state = "idle"
            self._allocate()
            self.condition.notify_all()

    def _stage(self, ticket: Ticket) -> None:
        ticket.state = "staged"
        ticket.staged_at = next(self.order)
        self.staged.append(ticket)

    def _give_back(self, ticket: Ticket) -> None:
        for key, count in ticket.needs.items():
            self.taken[key] = self.taken.get(key, 0) - count
        ticket.state = "idle"

    def _allocate(self) -> None:
        """Give resources to staged instances in priority order, while the first fits."""
        allocated = False
        while self.staged:
            first = min(self.staged, key=Ticket.scaled_priority)
            if any(self.taken.get(key, 0) + count > self.limits.get(key, 0)
                   for key, count in first.needs.items()):
                break
            for key, count in first.needs.items():
                self.taken[key] = self.taken.get(key, 0) + count
            self.staged.remove(first)
            first.state = "allocated"
            allocated = True
        if allocated:
            self.condition.notify_all()


def max_resource_map(limits: dict) -> str:
    """The copies of each resource in Triton's verbose words: global ones first, then
    each device's, names in order."""
    lines = ["", "Max Resource Map===>"]
    for where in sorted({where for where, _ in limits}, key=_global_first):
        lines.append(f"\tDevice: {'GLOBAL' if where == GLOBAL else where}")
        lines += [f"\t\tResource: {name}\t Count: {limits[(where, name)]}"
                  for name in sorted(name for at, name in limits if at == where)]
    return "\n".join(lines) + "\n"


def _global_first(where) -> tuple:
    return (0, 0) if where == GLOBAL else (1, where)


class _ResourceError(Exception):
    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name
        self.message = message


def _instances(config: mc.ModelConfig, count: int):
    """(group index, group, index within the group) of each instance, in creation order."""
    made = 0
    for group_index, group in enumerate(config.instance_group):
        for index in range(group.count):
            if made == count:
                return
            made += 1
            yield group_index, group, index


def gates_for(limiter: "RateLimiter | None", context, instance_count: int) -> list | None:
    """A Gate per instance (None where not limited), or None when nothing is limited."""
    if limiter is None:
        return None
    tickets = limiter.register(context.config, context.version, instance_count,
                               context.config_source)
    if not any(tickets):
        return None
    return [None if ticket is None else Gate(limiter, ticket) for ticket in tickets]


def gates_for_members(limiter: "RateLimiter | None", context, members: list) -> list | None:
    """As `gates_for`, for the instances an instance-group update adds: `members` holds
    (group, index in the group) of each."""
    if limiter is None:
        return None
    tickets = limiter.register_members(context.config, context.version, members,
                                       context.config_source)
    if not any(tickets):
        return None
    return [None if ticket is None else Gate(limiter, ticket) for ticket in tickets]


def release_gates(gates: list | None) -> None:
    """The version unloads: its instances compete no more."""
    if gates:
        live = [gate for gate in gates if gate is not None]
        if live:
            live[0].limiter.unregister([gate.ticket for gate in live])


def _located(error: _ResourceError, config: mc.ModelConfig, source) -> TritonError:
    """The error at the config's entry asking for most of the resource."""
    entries = [(resource.count, ("instance_group", group_index, "rate_limiter", "resources",
                                 resource_index, "count"))
               for group_index, group in enumerate(config.instance_group)
               for resource_index, resource in enumerate(group.rate_limiter.resources)
               if resource.name == error.name]
    if not entries:
        return invalid_arg(error.message)
    return field_error(source, max(entries)[1], error.message)

"""Which folder each model serves from, over every repository, as Triton decides it.

Without --model-namespacing a model is known by its name alone, so a name found in two
or more repositories could mean either folder: Triton serves it from none of them (it
logs that the name is not unique, lists it in the repository index as UNAVAILABLE, and
refuses to load it) until one of the folders is gone. A name mapped to a folder when a
repository was registered (the registration extension) is the one exception: the
mapping says which folder, so it wins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .namespaces import name_of

log = logging.getLogger("mini_triton.repository")

# Triton's MODEL_READY_REASON_DUPLICATE: the index's reason for such a name.
DUPLICATE_REASON = "model appears in two or more repositories"


@dataclass
class Listing:
    """The model folders to serve, by key, and the keys that no folder serves."""

    folders: dict[str, Path] = field(default_factory=dict)
    duplicates: set[str] = field(default_factory=set)


def merge(listings: Iterable[dict[str, Path]], mapped: dict[str, Path]) -> Listing:
    """One listing (key → folder) per repository merged into one: a key that two or
    more of them hold is a duplicate, in no folder; a `mapped` key wins outright."""
    merged = Listing()
    for listing in listings:
        for key, folder in listing.items():
            if key in merged.folders or key in merged.duplicates:
                merged.folders.pop(key, None)
                merged.duplicates.add(key)
            else:
                merged.folders[key] = folder
    merged.duplicates -= set(mapped)
    merged.folders.update(mapped)
    return merged


def log_not_unique(keys: Iterable[str]) -> None:
    """Triton's line for each name that it did not load because it is not unique."""
    for key in sorted(keys):
        log.error("failed to poll model '%s': not unique across all model repositories",
                  name_of(key))

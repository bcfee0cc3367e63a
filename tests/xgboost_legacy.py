"""XGBoost's legacy binary model format (`xgboost.model`, FIL's model_type "xgboost"),
written from a booster's JSON: XGBoost 3 saves JSON and UBJSON only, while Treelite
and Triton's FIL still read the old format. The layout is the one XGBoost 1.x wrote
(LearnerModelParam, objective and booster names, GBTreeModelParam, then each tree's
TreeParam, nodes and node statistics, then the tree-to-class map), little-endian."""

from __future__ import annotations

import json
import struct
from pathlib import Path

_MAJOR, _MINOR = 1, 7  # the writer's version: base_score stored untransformed (>= 1.0)


def _name(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _base_score(text) -> float:
    """base_score as XGBoost 3 writes it: "5E-1", or "[5E-1]" with one value per class,
    which the legacy format cannot hold unless they are all the same."""
    values = {float(value) for value in str(text).strip("[]").split(",")}
    if len(values) != 1:
        raise ValueError(f"base_score {text} has one value per class; the legacy binary "
                         "format holds one")
    return values.pop()


def _tree(tree: dict, num_feature: int) -> bytes:
    count = len(tree["left_children"])
    out = [struct.pack("<6i31i", 1, count, 0, 0, num_feature, 0, *([0] * 31))]
    for node in range(count):
        left, right = tree["left_children"][node], tree["right_children"][node]
        parent = tree["parents"][node]
        if node == 0:
            parent = -1
        elif tree["left_children"][parent] == node:
            parent |= 1 << 31
        split = tree["split_indices"][node] | (int(tree["default_left"][node]) << 31)
        out.append(struct.pack("<IiiIf", parent & 0xFFFFFFFF, left, right, split,
                               tree["split_conditions"][node]))
    for node in range(count):
        out.append(struct.pack("<fffi", tree["loss_changes"][node], tree["sum_hessian"][node],
                               tree["base_weights"][node], 0))
    return b"".join(out)


def save_legacy_binary(booster, path: Path) -> None:
    """Write `booster` (an xgboost.Booster of gbtree) in the legacy binary format."""
    learner = json.loads(booster.save_raw("json"))["learner"]
    param = learner["learner_model_param"]
    num_feature, num_class = int(param["num_feature"]), int(param["num_class"])
    model = learner["gradient_booster"]["model"]
    trees = model["trees"]
    header = struct.pack("<fIiiiIII26i", _base_score(param["base_score"]), num_feature, num_class,
                         0, 0, _MAJOR, _MINOR, int(param.get("num_target", 1)), *([0] * 26))
    booster_param = struct.pack("<iiiiqii32i", len(trees), 1, num_feature, 0, 0,
                                max(num_class, 1), 0, *([0] * 32))
    body = [header, _name(learner["objective"]["name"]), _name("gbtree"), booster_param]
    body += [_tree(tree, num_feature) for tree in trees]
    body.append(struct.pack(f"<{len(trees)}i", *model["tree_info"]))
    Path(path).write_bytes(b"".join(body))

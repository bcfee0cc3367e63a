"""Tree models for the FIL backend's tests, trained here on fixed seeds, and Triton
FIL model folders holding them (config.pbtxt as Triton's FIL docs write it). Test
modules import it after `pytest.importorskip` of the libraries."""

from __future__ import annotations

import json
from pathlib import Path

import lightgbm
import numpy as np
import treelite
import treelite.sklearn
import xgboost
from sklearn.ensemble import RandomForestClassifier

FEATURES = 16


def rows(count: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, FEATURES)).astype(np.float32)


def _training(seed: int = 0):
    x = rows(600, seed)
    binary = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
    three = np.digitize(x[:, 0] + x[:, 3], [-0.5, 0.5])
    target = 2 * x[:, 0] - x[:, 4] + 0.1 * x[:, 5] ** 2
    return x, binary, three, target


def xgboost_classifier(classes: int = 2, objective: str | None = None):
    x, binary, three, _ = _training()
    labels = binary if classes == 2 else three
    extra = {"objective": objective} if objective else {}
    return xgboost.XGBClassifier(n_estimators=20, max_depth=4, n_jobs=1, random_state=0,
                                 **extra).fit(x, labels)


def xgboost_regressor():
    x, _, _, target = _training()
    return xgboost.XGBRegressor(n_estimators=20, max_depth=4, n_jobs=1,
                                random_state=0).fit(x, target)


def lightgbm_regressor():
    x, _, _, target = _training()
    return lightgbm.LGBMRegressor(n_estimators=20, num_leaves=15, random_state=0,
                                  n_jobs=1, verbose=-1).fit(x, target)


def lightgbm_classifier():
    x, binary, _, _ = _training()
    return lightgbm.LGBMClassifier(n_estimators=20, num_leaves=15, random_state=0,
                                   n_jobs=1, verbose=-1).fit(x, binary)


def sklearn_forest():
    x, _, three, _ = _training()
    return RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(x, three)


def treelite_checkpoint(forest, path: Path) -> None:
    """A scikit-learn forest as FIL takes it: a Treelite checkpoint (Triton's docs)."""
    treelite.sklearn.import_model(forest).serialize(str(path))


def fil_config(name: str, model_type: str, output_dims: int = 1, *,
               max_batch_size: int = 64, features: int = FEATURES, instances: str = "",
               **parameters: str) -> str:
    params = {"model_type": model_type, **parameters}
    listed = ",\n".join(f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
                        for key, value in params.items())
    return f"""name: "{name}"
backend: "fil"
max_batch_size: {max_batch_size}
input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }}]
output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {output_dims} ] }}]
{instances or 'instance_group [{ kind: KIND_AUTO }]'}
parameters [
{listed}
]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""


def write_fil_model(repository: Path, name: str, config: str, filename: str,
                    save) -> Path:
    """A model folder: config.pbtxt, and `save(path)` writing version 1's file."""
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    save(version / filename)
    return version / filename


def save_with_unknown_field(booster, path: Path) -> None:
    """XGBoost JSON with a field XGBoost's schema lacks (a newer writer's, say): Treelite
    refuses it unless `xgboost_allow_unknown_field` is true."""
    document = json.loads(booster.save_raw("json"))
    document["learner"]["written_by_a_newer_xgboost"] = 1
    Path(path).write_text(json.dumps(document))

"""A tree ensemble loaded from a FIL model file, and its predictors.

Treelite reads every format FIL reads, so every file is loaded through it first:
that checks the file (a LightGBM file cut short crashes LightGBM's own loader,
where Treelite reports what is missing) and tells the feature and class counts.
Rows are then predicted by whichever gives the same answers faster, as measured
in perf/bench_backends.py: LightGBM's own predict for LightGBM files; for XGBoost
JSON and UBJSON, Treelite's GTIL below `NATIVE_XGBOOST_FROM_ROWS` rows (XGBoost's
per-call cost dominates small batches) and XGBoost's `inplace_predict` from there;
GTIL for legacy XGBoost binaries and Treelite checkpoints, which nothing else reads.
The framework's predict stands in for GTIL only where it gives GTIL's answers on fixed
probe rows (XGBoost's multi:softmax objective answers classes where Treelite, as FIL,
gives probabilities).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import treelite

from ...core.errors import unavailable
from .settings import FilSettings

log = logging.getLogger("mini_triton.backends.fil")

# Rows from which XGBoost's own predict is faster than GTIL (16 features, 100 trees of
# depth 6 on one thread: GTIL 63k rows/s at 8 rows against 32k; XGBoost 134k at 64
# against 74k).
NATIVE_XGBOOST_FROM_ROWS = 32
_LIGHTGBM_END = b"end of trees"
_PROBE_ROWS = 64
# "[07:47:25] /project/src/model_loader/lightgbm.cc:312: " before a Treelite message
_SOURCE_PREFIX = re.compile(r"^(\[[\d:]+\] )?(\S+:\d+: )?")


class Forest:
    """One instance's model: `predict(rows)` gives (rows, classes) float32 scores,
    probabilities for a classifier, as the framework's own predict gives them."""

    def __init__(self, tl_model, nthread: int, native=None, native_from_rows: int = 0):
        self.tl_model = tl_model
        self.nthread = nthread
        self.native = native  # (rows) -> scores, or None
        self.native_from_rows = native_from_rows
        header = tl_model.get_header_accessor()
        self.num_feature = int(tl_model.num_feature)
        self.num_class = int(header.get_field("num_class")[0])

    def predict(self, rows: np.ndarray) -> np.ndarray:
        if self.native is not None and len(rows) >= self.native_from_rows:
            scores = self.native(rows)
        else:
            scores = treelite.gtil.predict(self.tl_model, rows, nthread=self.nthread)
        return np.asarray(scores, dtype=np.float32).reshape(len(rows), self.num_class)


def load_forest(path: Path, settings: FilSettings, model: str, nthread: int) -> Forest:
    tl_model = _load_treelite(path, settings, model)
    if settings.model_type == "lightgbm":
        _check_lightgbm_complete(path, model)
    native, from_rows = _native_predict(path, settings, model, nthread)
    forest = Forest(tl_model, nthread, native, from_rows)
    if native is not None and not _native_agrees(forest):
        log.info("model '%s': %s's own predict answers otherwise than Treelite for '%s' "
                 "(its objective, e.g. multi:softmax, answers classes); Treelite predicts",
                 model, settings.model_type, path)
        forest.native = None
    return forest


def _native_predict(path: Path, settings: FilSettings, model: str, nthread: int):
    """(the framework's own predict or None, the rows from which it is used)."""
    try:
        if settings.model_type == "lightgbm":
            return _lightgbm_predict(path, nthread), 0
        if settings.model_type in ("xgboost_json", "xgboost_ubj"):
            return _xgboost_predict(path, nthread), NATIVE_XGBOOST_FROM_ROWS
    except ImportError as error:
        raise unavailable(f"unable to load model '{model}': {error} (pip install "
                          "'mini-triton[fil]')") from None
    except Exception as error:  # noqa: BLE001 - Treelite read the file: it can predict
        log.info("model '%s': %s's own loader refused '%s' (%s); Treelite predicts", model,
                 settings.model_type, path, _first_line(error))
    return None, 0


def _native_agrees(forest: Forest) -> bool:
    """Whether the framework's predict gives Treelite's answers (to float32 rounding) on
    fixed random rows: only then may it stand in for Treelite."""
    rows = np.random.default_rng(0).normal(size=(_PROBE_ROWS, forest.num_feature))
    rows = rows.astype(np.float32)
    expected = np.asarray(treelite.gtil.predict(forest.tl_model, rows, nthread=1))
    try:
        got = np.asarray(forest.native(rows), dtype=np.float32)
    except Exception:  # noqa: BLE001 - any failure means it cannot stand in
        return False
    return got.size == expected.size and np.allclose(
        got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-6)


def _load_treelite(path: Path, settings: FilSettings, model: str):
    try:
        return _treelite_loader(settings)(path)
    except (treelite.TreeliteError, OSError, ValueError) as error:
        raise unavailable(
            f"unable to load model '{model}': '{path}' is not {settings.file_description} "
            f"as model_type '{settings.model_type}' expects: {_first_line(error)}") from None


def _treelite_loader(settings: FilSettings):
    frontend = treelite.frontend
    unknown = settings.allow_unknown_field
    return {
        "xgboost": frontend.load_xgboost_model_legacy_binary,
        "xgboost_json": lambda path: frontend.load_xgboost_model(
            path, format_choice="json", allow_unknown_field=unknown),
        "xgboost_ubj": lambda path: frontend.load_xgboost_model(
            path, format_choice="ubjson", allow_unknown_field=unknown),
        "lightgbm": frontend.load_lightgbm_model,
        "treelite_checkpoint": treelite.Model.deserialize,
    }[settings.model_type]


def _check_lightgbm_complete(path: Path, model: str) -> None:
    """A LightGBM file lists its trees up to an `end of trees` line. Without it the file
    was cut short: Treelite may still read the trees before the cut, and LightGBM's own
    loader crashes the process on it."""
    if _LIGHTGBM_END not in path.read_bytes():
        raise unavailable(
            f"unable to load model '{model}': '{path}' is not a complete LightGBM model "
            "in its text format: it has no 'end of trees' line (was the file cut short?)")


def _lightgbm_predict(path: Path, nthread: int):
    import lightgbm  # the [fil] extra; only LightGBM models need it

    booster = lightgbm.Booster(model_file=str(path))
    return lambda rows: booster.predict(rows, num_threads=nthread)


def _xgboost_predict(path: Path, nthread: int):
    import xgboost  # the [fil] extra; only XGBoost models need it

    booster = xgboost.Booster(model_file=str(path))
    booster.set_param({"nthread": nthread})
    return lambda rows: booster.inplace_predict(rows, validate_features=False)


def _first_line(error: Exception) -> str:
    """A library's message without its time stamp, source location or stack trace."""
    lines = str(error).strip().splitlines()
    return _SOURCE_PREFIX.sub("", lines[0]) if lines else type(error).__name__

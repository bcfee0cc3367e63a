"""FIL folders that cannot load: the server stays up, the other models serve, and
each bad model is UNAVAILABLE with a reason that names its file and what was
expected, or FIL's own words for a parameter; `check-config` says the same."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

for _library in ("xgboost", "lightgbm", "treelite", "sklearn"):
    pytest.importorskip(_library, reason=f"{_library} is missing (pip install "
                        "'mini-triton[fil]' scikit-learn)")

from conftest import connect, server_settings  # noqa: E402
from fil_models import (fil_config, lightgbm_regressor, rows,  # noqa: E402
                        save_with_unknown_field, write_fil_model, xgboost_classifier)
from mini_triton.cli.check_config import main as check_config  # noqa: E402
from mini_triton.server import ServerThread  # noqa: E402


def _save_truncated_lightgbm(path):
    lightgbm_regressor().booster_.save_model(str(path))
    text = path.read_bytes()
    path.write_bytes(text[:len(text) // 2])  # cut in the middle of the trees


def _bad_models(json_file, classifier_booster):
    """name -> (config, file name, save(path), what the reason must say)."""
    copy_json = lambda path: shutil.copy(json_file, path)  # noqa: E731
    return {
        "json_as_ubj": (
            fil_config("json_as_ubj", "xgboost_ubj", 2, output_class="true", threshold="0.5",
                       predict_proba="true"),
            "xgboost.ubj", copy_json,
            ["json_as_ubj/1/xgboost.ubj' is not an XGBoost model in UBJSON as model_type "
             "'xgboost_ubj' expects"]),
        "lightgbm_cut_short": (
            fil_config("lightgbm_cut_short", "lightgbm", 1, output_class="false"),
            "model.txt", _save_truncated_lightgbm,
            ["lightgbm_cut_short/1/model.txt' is not", "LightGBM model"]),
        "unknown_field": (
            fil_config("unknown_field", "xgboost_json", 2, output_class="true",
                       threshold="0.5", predict_proba="true"),
            "xgboost.json", lambda path: save_with_unknown_field(classifier_booster, path),
            ["unknown_field/1/xgboost.json' is not an XGBoost model in JSON"]),
        "no_output_class": (
            fil_config("no_output_class", "xgboost_json", 2, predict_proba="true"),
            "xgboost.json", copy_json,
            ["Required parameter output_class not found in config"]),
        "no_threshold": (
            fil_config("no_threshold", "xgboost_json", 1, output_class="true"),
            "xgboost.json", copy_json, ["Required parameter threshold not found in config"]),
        "not_a_boolean": (
            fil_config("not_a_boolean", "xgboost_json", 1, output_class="yes"),
            "xgboost.json", copy_json,
            ["Expected 'true' or 'false' for parameter 'output_class', got: 'yes'"]),
        "unknown_model_type": (
            fil_config("unknown_model_type", "catboost", 1, output_class="false"),
            "xgboost.json", copy_json,
            ["catboost not recognized as a valid serialization format."]),
        "wrong_feature_count": (
            fil_config("wrong_feature_count", "xgboost_json", 2, features=8,
                       output_class="true", threshold="0.5", predict_proba="true"),
            "xgboost.json", copy_json,
            ["wrong_feature_count/1/xgboost.json' has 16 features", "gives [8]"]),
        "proba_needs_two_columns": (
            fil_config("proba_needs_two_columns", "xgboost_json", 1, output_class="true",
                       threshold="0.5", predict_proba="true"),
            "xgboost.json", copy_json, ["output 'output__0' has dims [2]"]),
        "file_missing": (
            fil_config("file_missing", "lightgbm", 1, output_class="false"),
            "xgboost.json", copy_json,
            ["file_missing/1/model.txt'", "expects a LightGBM model in its text format"]),
    }


@pytest.fixture(scope="module")
def bad_repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("fil_bad")
    source = tmp_path_factory.mktemp("fil_source") / "xgboost.json"
    classifier = xgboost_classifier(2)
    classifier.get_booster().save_model(source)
    models = _bad_models(source, classifier.get_booster())
    for name, (config, filename, save, _) in models.items():
        write_fil_model(repository, name, config, filename, save)
    write_fil_model(repository, "good", fil_config(
        "good", "xgboost_json", 2, output_class="true", threshold="0.5",
        predict_proba="true"), "xgboost.json", lambda path: shutil.copy(source, path))
    return repository, models, classifier


@pytest.fixture(scope="module")
def bad_server(bad_repository):
    settings = server_settings(bad_repository[0], exit_on_error=False)
    with ServerThread(settings) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_models_are_unavailable_and_the_rest_serve(bad_server, bad_repository, protocol):
    _, models, classifier = bad_repository
    proto = connect(protocol, bad_server)
    reasons = {entry["name"]: entry.get("reason", "")
               for entry in bad_server.server.manager.index()}
    for name, (_, _, _, expected) in models.items():
        assert not proto.client.is_model_ready(name), name
        for words in expected:
            assert words in reasons[name], (name, reasons[name])
        assert "Traceback" not in reasons[name]
    x = rows(3)
    tensor = proto.module.InferInput("input__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    got = proto.client.infer("good", [tensor]).as_numpy("output__0")
    np.testing.assert_allclose(got, classifier.predict_proba(x), rtol=1e-5, atol=1e-6)
    proto.client.close()


@pytest.mark.parametrize("name", ["json_as_ubj", "lightgbm_cut_short", "no_threshold",
                                  "wrong_feature_count"])
def test_check_config_reports_what_loading_reports(bad_repository, capsys, name):
    repository, models, _ = bad_repository
    assert check_config([str(repository / name)]) == 2
    err = capsys.readouterr().err
    assert models[name][3][0] in err, err

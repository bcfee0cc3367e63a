"""The FIL backend served end to end: Triton FIL folders of XGBoost (JSON, UBJSON and
the legacy binary format), LightGBM and scikit-learn (as a Treelite checkpoint)
models answer as the frameworks' own predict does, over HTTP and gRPC with stock
tritonclient."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

for _library in ("xgboost", "lightgbm", "treelite", "sklearn"):
    pytest.importorskip(_library, reason=f"{_library} is missing (pip install "
                        "'mini-triton[fil]' scikit-learn)")

from conftest import STATUS, connect, protocol_fixture, server_settings  # noqa: E402
from fil_models import (fil_config, lightgbm_classifier, lightgbm_regressor,  # noqa: E402
                        rows, save_with_unknown_field, sklearn_forest, treelite_checkpoint,
                        write_fil_model, xgboost_classifier, xgboost_regressor)
from mini_triton.backends.fil.forest import NATIVE_XGBOOST_FROM_ROWS  # noqa: E402
from mini_triton.server import ServerThread  # noqa: E402
from xgboost_legacy import save_legacy_binary  # noqa: E402

TRAINED = {}


def _models():
    """name -> (config, file name, save(path), expected(x) -> answers)."""
    binary, three = xgboost_classifier(2), xgboost_classifier(3)
    # XGBoost's own predict answers classes for multi:softmax, Treelite probabilities
    softmax = xgboost_classifier(3, objective="multi:softmax")
    regressor, lgb_regressor = xgboost_regressor(), lightgbm_regressor()
    lgb_binary, forest = lightgbm_classifier(), sklearn_forest()
    booster = binary.get_booster()
    return {
        "xgb_proba": (fil_config("xgb_proba", "xgboost_json", 2, output_class="true",
                                 threshold="0.5", predict_proba="true"),
                      "xgboost.json", booster.save_model, binary.predict_proba),
        "xgb_class": (fil_config("xgb_class", "xgboost_ubj", 1, output_class="true",
                                 threshold="0.3"),
                      "xgboost.ubj", booster.save_model,
                      lambda x: (binary.predict_proba(x)[:, 1] > 0.3).astype(np.float32)),
        "xgb_any_width": (fil_config("xgb_any_width", "xgboost_json", 2, features=-1,
                                     output_class="true", threshold="0.5",
                                     predict_proba="true"),
                          "xgboost.json", booster.save_model, binary.predict_proba),
        "xgb_unknown_field": (fil_config("xgb_unknown_field", "xgboost_json", 1,
                                         output_class="false",
                                         xgboost_allow_unknown_field="true"),
                              "xgboost.json",
                              lambda p: save_with_unknown_field(regressor.get_booster(), p),
                              regressor.predict),
        "xgb_multi": (fil_config("xgb_multi", "xgboost_json", 1, output_class="true",
                                 threshold="0.5"),
                      "xgboost.json", three.get_booster().save_model, three.predict),
        "xgb_multi_proba": (fil_config("xgb_multi_proba", "xgboost_ubj", 3,
                                       output_class="true", threshold="0.5",
                                       predict_proba="true"),
                            "xgboost.ubj", three.get_booster().save_model,
                            three.predict_proba),
        "xgb_softmax_proba": (fil_config("xgb_softmax_proba", "xgboost_json", 3,
                                         output_class="true", threshold="0.5",
                                         predict_proba="true"),
                              "xgboost.json", softmax.get_booster().save_model,
                              softmax.predict_proba),
        "xgb_regressor": (fil_config("xgb_regressor", "xgboost_json", 1,
                                     output_class="false"),
                          "xgboost.json", regressor.get_booster().save_model,
                          regressor.predict),
        # model_type "xgboost": the legacy binary format (tests/xgboost_legacy.py writes it)
        "xgb_legacy": (fil_config("xgb_legacy", "xgboost", 2, output_class="true",
                                  threshold="0.5", predict_proba="true"),
                       "xgboost.model", lambda p: save_legacy_binary(booster, p),
                       binary.predict_proba),
        "xgb_legacy_regressor": (fil_config("xgb_legacy_regressor", "xgboost", 1,
                                            output_class="false"),
                                 "xgboost.model",
                                 lambda p: save_legacy_binary(regressor.get_booster(), p),
                                 regressor.predict),
        "lgb_regressor": (fil_config("lgb_regressor", "lightgbm", 1, output_class="false",
                                     instances="instance_group [{ kind: KIND_CPU count: 2 }]"),
                          "model.txt", lambda p: lgb_regressor.booster_.save_model(str(p)),
                          lgb_regressor.predict),
        # max_batch_size 0: the rows are the first of the input's own dims
        "lgb_unbatched": (fil_config("lgb_unbatched", "lightgbm", 1, output_class="false",
                                     max_batch_size=0)
                          .replace("dims: [ 16 ]", "dims: [ -1, 16 ]")
                          .replace("dims: [ 1 ]", "dims: [ -1, 1 ]"),
                          "model.txt", lambda p: lgb_regressor.booster_.save_model(str(p)),
                          lgb_regressor.predict),
        "lgb_score": (fil_config("lgb_score", "lightgbm", 1, output_class="false"),
                      "model.txt", lambda p: lgb_binary.booster_.save_model(str(p)),
                      lambda x: lgb_binary.predict_proba(x)[:, 1]),
        "sklearn_forest": (fil_config("sklearn_forest", "treelite_checkpoint", 3,
                                      output_class="true", threshold="0.5",
                                      predict_proba="true", cpu_nthread="1"),
                           "checkpoint.tl", lambda p: treelite_checkpoint(forest, p),
                           forest.predict_proba),
    }


@pytest.fixture(scope="module")
def fil_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("fil")
    for name, (config, filename, save, expected) in _models().items():
        write_fil_model(repository, name, config, filename, save)
        TRAINED[name] = expected
    with ServerThread(server_settings(repository)) as server:
        yield server


proto = protocol_fixture("fil_server")


def infer(proto, model: str, x: np.ndarray, datatype: str = "FP32") -> np.ndarray:
    tensor = proto.module.InferInput("input__0", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return proto.client.infer(model, [tensor]).as_numpy("output__0")


@pytest.mark.parametrize("model", ["xgb_proba", "xgb_class", "xgb_multi", "xgb_multi_proba",
                                   "xgb_regressor", "xgb_unknown_field", "xgb_legacy",
                                   "xgb_legacy_regressor",
                                   "lgb_regressor", "lgb_unbatched", "lgb_score",
                                   "sklearn_forest"])
def test_answers_equal_the_frameworks_own(proto, model):
    x = rows(7, seed=5)
    expected = np.asarray(TRAINED[model](x), dtype=np.float32)
    got = infer(proto, model, x)
    assert got.dtype == np.float32
    assert got.shape == expected.shape  # dims [1] come back as [batch], as FIL squeezes
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("count", [3, 40])
def test_multi_softmax_answers_probabilities_at_every_batch_size(proto, count):
    """From NATIVE_XGBOOST_FROM_ROWS rows XGBoost's own predict would answer classes."""
    x = rows(count, seed=12)
    np.testing.assert_allclose(infer(proto, "xgb_softmax_proba", x),
                               TRAINED["xgb_softmax_proba"](x), rtol=1e-5, atol=1e-6)


def test_binary_predict_proba_answers_two_columns(proto):
    got = infer(proto, "xgb_proba", rows(4, seed=9))
    assert got.shape == (4, 2)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("count", [1, NATIVE_XGBOOST_FROM_ROWS - 1, NATIVE_XGBOOST_FROM_ROWS,
                                   64])
def test_small_and_large_batches_give_the_same_answers(proto, count):
    """Below NATIVE_XGBOOST_FROM_ROWS rows Treelite predicts, from there XGBoost."""
    x = rows(64, seed=11)
    whole = infer(proto, "xgb_regressor", x)
    np.testing.assert_allclose(infer(proto, "xgb_regressor", x[:count]), whole[:count],
                               rtol=1e-6, atol=1e-6)


def test_requests_are_batched_and_statistics_kept(fil_server):
    proto = connect("grpc", fil_server)
    x = rows(40, seed=3)
    expected = np.asarray(TRAINED["lgb_regressor"](x), dtype=np.float32)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: infer(proto, "lgb_regressor", x[i:i + 1]),
                                range(len(x))))
    np.testing.assert_allclose(np.concatenate(answers), expected, rtol=1e-5, atol=1e-6)
    stats = proto.model_statistics("lgb_regressor")
    assert int(stats["inference_count"]) >= len(x)
    assert int(stats["execution_count"]) < int(stats["inference_count"])  # batched
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert int(stats["inference_stats"][part]["count"]) > 0, part
    proto.client.close()


def test_a_wrong_feature_count_is_refused_with_tritons_words(proto):
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "xgb_proba", np.zeros((2, 8), np.float32))
    assert proto.status_of(error.value) == STATUS[proto.name]["INVALID_ARG"]
    assert ("unexpected shape for input 'input__0' for model 'xgb_proba'. Expected [-1,16], "
            "got [2,8]") in str(error.value)


def test_a_wrong_feature_count_under_dims_minus_one_is_refused_with_tritons_words(proto):
    np.testing.assert_allclose(infer(proto, "xgb_any_width", rows(2)),
                               TRAINED["xgb_any_width"](rows(2)), rtol=1e-5, atol=1e-6)
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "xgb_any_width", np.zeros((2, 8), np.float32))
    assert proto.status_of(error.value) == STATUS[proto.name]["INVALID_ARG"]
    assert ("unexpected shape for input 'input__0' for model 'xgb_any_width'. Expected "
            "[-1,16], got [2,8]") in str(error.value)


def test_a_wrong_datatype_is_refused_with_tritons_words(proto):
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "xgb_proba", np.zeros((2, 16), np.float64), "FP64")
    assert proto.status_of(error.value) == STATUS[proto.name]["INVALID_ARG"]
    assert ("inference input 'input__0' data-type is 'FP64', but model 'xgb_proba' expects "
            "'FP32'") in str(error.value)


def test_gpu_groups_and_fils_speed_parameters_are_named_and_answers_unchanged(
        tmp_path, caplog):
    regressor = xgboost_regressor()
    write_fil_model(tmp_path, "tuned", fil_config(
        "tuned", "xgboost_json", 1, output_class="false", storage_type="SPARSE16",
        threads_per_tree="4", use_experimental_optimizations="true",
        instances="instance_group [{ kind: KIND_GPU }]"),
        "xgboost.json", regressor.get_booster().save_model)
    with ServerThread(server_settings(tmp_path)) as server:
        proto = connect("http", server)
        x = rows(4)
        tensor = proto.module.InferInput("input__0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = proto.client.infer("tuned", [tensor]).as_numpy("output__0")
        proto.client.close()
    assert ("parameters storage_type, threads_per_tree, use_experimental_optimizations tune "
            "the speed of FIL's own forests") in caplog.text
    assert "FIL instance 0 asks for KIND_GPU; this server predicts trees on the CPU" \
        in caplog.text
    assert "storage_type 'SPARSE16' is none of FIL's (AUTO, DENSE, SPARSE, SPARSE8)" \
        in caplog.text
    assert got.tolist() == pytest.approx(regressor.predict(x).tolist(), rel=1e-5)

"""A load computes its plan first (which models, steps before the ensemble that uses them),
reading each model's config file once, then loads each model once."""

from __future__ import annotations

import logging

import pytest

import mini_triton.config
from conftest import connect, server_settings
from mini_triton.server import ServerThread
from test_lifecycle import chain, write_ensemble, write_model


@pytest.fixture
def config_reads(monkeypatch) -> list[str]:
    """The config texts parsed from here on (every config file read goes through it)."""
    texts: list[str] = []
    parse = mini_triton.config.parse_config_text

    def counted(text, *args, **kwargs):
        texts.append(text)
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(mini_triton.config, "parse_config_text", counted)
    return texts


def loads_of(caplog, model: str) -> int:
    """How many times `model` version 1 was loaded (Triton's 'loading: NAME:1' line)."""
    return sum(record.getMessage() == f"loading: {model}:1" for record in caplog.records)


def test_explicit_load_of_an_ensemble_reads_each_config_once(tmp_path, config_reads):
    write_model(tmp_path, "m")
    write_ensemble(tmp_path)
    with ServerThread(server_settings(tmp_path, model_control_mode="explicit")) as server:
        http = connect("http", server)
        config_reads.clear()
        http.client.load_model("chain")
        assert len(config_reads) == 2  # the ensemble's and its step's
        chain(http)


def test_an_ensemble_loaded_with_its_returning_step_loads_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mini_triton.repository")
    write_model(tmp_path, "m")
    write_ensemble(tmp_path)
    with ServerThread(server_settings(tmp_path, model_control_mode="explicit")) as server:
        grpc = connect("grpc", server)
        grpc.client.load_model("chain")
        grpc.client.unload_model("m")  # the ensemble stays loaded, its step gone
        caplog.clear()
        grpc.client.load_model("chain")  # the step first, then the ensemble: once
        assert (loads_of(caplog, "m"), loads_of(caplog, "chain")) == (1, 1)
        chain(grpc)

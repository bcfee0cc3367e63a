"""`mini-triton check-config PATH...`: JSON for configs that read, PATH:LINE:COLUMN for those
that do not, exit status 2 when any fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mini_triton.cli.check_config import main

GOOD = ('name: "good"\nbackend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
BAD = 'name: "bad"\nmax_batch_size 8\n'
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def configs(tmp_path):
    good = tmp_path / "good" / "config.pbtxt"
    bad = tmp_path / "bad" / "config.pbtxt"
    for path, text in ((good, GOOD), (bad, BAD)):
        (path.parent / "1").mkdir(parents=True)
        path.write_text(text)
    return good, bad


def test_good_config_prints_its_completed_json(configs, capsys):
    """What GET /v2/models/NAME/config gives once it loads: every field, defaults filled."""
    good, _ = configs
    assert main([str(good)]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert (printed["name"], printed["backend"], printed["max_batch_size"]) == (
        "good", "identity", 8)
    assert [(t["name"], t["data_type"], t["dims"]) for t in printed["input"]] == [
        ("x", "TYPE_FP32", [-1])]
    assert printed["output"] == []
    assert printed["version_policy"] == {"latest": {"num_versions": 1}}
    assert [group["kind"] for group in printed["instance_group"]] == ["KIND_CPU"]
    assert err == ""


def test_model_directory_means_its_config(configs, capsys):
    good, _ = configs
    assert main([str(good.parent)]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "good"


def test_bad_config_reports_path_line_column_and_exit_2(configs, capsys):
    good, bad = configs
    assert main([str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["name"] == "good"
    assert err.startswith(f'{bad}:2:16: expected ":" between field name "max_batch_size"')


def test_every_file_is_checked_even_after_a_failure(configs, capsys):
    good, bad = configs
    assert main([str(bad), str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 2
    assert json.loads(out)["max_batch_size"] == 8


def test_missing_file_fails(tmp_path, capsys):
    assert main([str(tmp_path / "absent.pbtxt")]) == 2
    assert "absent.pbtxt: cannot read" in capsys.readouterr().err


def test_an_empty_folder_is_neither_a_model_nor_a_repository(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "neither a model folder" in capsys.readouterr().err


def test_a_repository_is_every_model_in_it(tmp_path, capsys):
    for name, text in (("a", 'backend: "identity"'),
                       ("b", 'backend: "identity" max_batch_size: -1')):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(text)
    assert main([str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["name"] == "a"
    assert err == (f"{tmp_path / 'b' / 'config.pbtxt'}:1:21: model 'b' breaks rule "
                   "max_batch_size_non_negative: 'max_batch_size' must be non-negative value "
                   "for b\n")


def test_a_version_folder_without_its_model_file_is_reported(tmp_path, capsys):
    (tmp_path / "p" / "1").mkdir(parents=True)
    (tmp_path / "p" / "config.pbtxt").write_text('backend: "python"')
    assert main([str(tmp_path / "p")]) == 2
    assert "rule model_file: model file 'model.py' of model 'p' is missing from version " \
        "folder" in capsys.readouterr().err


def test_no_paths_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "usage: mini-triton check-config" in capsys.readouterr().err


def test_an_unknown_flag_is_a_usage_error(configs, capsys):
    good, _ = configs
    assert main(["--no-such-flag", str(good)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage: mini-triton check-config" in err
    assert "unrecognized arguments: --no-such-flag" in err


def test_a_bad_backend_config_is_a_usage_error(configs, capsys):
    good, _ = configs
    assert main(["--backend-config=,x=1", str(good)]) == 2
    assert "No backend specified" in capsys.readouterr().err


def test_an_unknown_backend_is_refused_as_loading_refuses_it(tmp_path, capsys):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "warp_drive"')
    assert main([str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        f"{tmp_path / 'm' / 'config.pbtxt'}: model 'm' breaks rule backend_auto_complete: "
        "unable to find backend library for backend 'warp_drive', try specifying runtime on "
        "the model configuration. Known backends: ensemble, fil, identity, onnxruntime, "
        "openvino, python, pytorch, tensorrt\n")


def test_check_config_in_a_fresh_process(configs):
    good, bad = configs
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys; from mini_triton.cli.check_config import main; sys.exit(main(sys.argv[1:]))",
         str(good), str(bad)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )
    assert done.returncode == 2
    assert json.loads(done.stdout)["input"][0]["dims"] == [-1]
    assert done.stderr.startswith(f"{bad}:2:16: ")


def test_check_config_through_the_command_line_entry_point(configs, capsys):
    cli = pytest.importorskip("mini_triton.cli")
    good, bad = configs
    assert cli.main(["check-config", str(good)]) == 0
    assert cli.main(["check-config", str(bad)]) == 2


def test_check_config_into_a_closed_pipe_stops_quietly():
    """`mini-triton check-config ... | head -1`: no BrokenPipeError traceback."""
    import subprocess
    import sys
    from pathlib import Path

    repository = Path(__file__).resolve().parent.parent / "model_repository"
    folders = sorted(str(p) for p in repository.iterdir() if (p / "config.pbtxt").exists())
    command = [sys.executable, "-m", "mini_triton", "check-config", *folders * 20]
    reader = subprocess.Popen(["head", "-1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    done = subprocess.run(command, stdout=reader.stdin, stderr=subprocess.PIPE, text=True,
                          timeout=60)
    reader.stdin.close()
    assert reader.stdout.read().strip() == b"{"
    reader.wait(10)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr

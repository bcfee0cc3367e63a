"""The documentation holds together and stays true to the code.

- Every relative link and anchor in README.md and docs/*.md resolves (anchors as GitHub
  makes them from headings).
- README.md has the shape a new user needs: the name, one sentence, exactly the two
  commands (the second one is CI's), a feature table, links to every docs page, and it
  stays short.
- The feature table says only what the code and tests bear out: each row is supported,
  partial or not yet; a supported or partial row names test files that exist; the
  extensions it calls supported are the ones the server metadata lists, and the
  tritonserver flags it names have the status the flag table gives them.
- The config field table of docs/model-repository.md is the one config/coverage.py
  holds (`python tests/test_docs_links.py` rewrites it), every flag the server honours is
  in docs/deployment.md, and every dashboard panel is explained in docs/observability.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mini_triton.cli import build_parser  # noqa: E402
from mini_triton.config.coverage import FIELDS, HONOURED, IRRELEVANT, WARNED  # noqa: E402
from mini_triton.cli.triton_flags import BY_NAME, NOT_HONOURED  # noqa: E402

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
CONFIG_PAGE = DOCS / "model-repository.md"
FIELDS_BEGIN, FIELDS_END = "<!-- config fields: begin -->\n", "<!-- config fields: end -->\n"

FENCE = re.compile(r"^ *(```+|~~~+)")
HEADING = re.compile(r"^(#{1,6}) +(.*?) *#*$")
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def prose_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match and (fence is None or match[1].startswith(fence)):
            fence = match[1][:3] if fence is None else None
            continue
        if fence is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed
    (hyphens and underscores kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(page):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in prose_lines(page):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, match[1]))
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for number, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            destination = (page.parent / unquote(path_part)).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not destination.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{where} (no heading with that anchor)")
            elif anchor and destination.suffix != ".md":
                broken.append(f"{where} (an anchor into a file that is not Markdown)")
    assert broken == []


def test_slugs_are_githubs():
    assert slug("Python models (Triton's Python backend)") == \
        "python-models-tritons-python-backend"
    assert slug("Auto-complete (off with `--disable-auto-complete-config`)") == \
        "auto-complete-off-with---disable-auto-complete-config"
    assert slug("The `classifier` model of the default repository") == \
        "the-classifier-model-of-the-default-repository"
    assert slug("BLS (calling other models)") == "bls-calling-other-models"
    assert slug("Where we differ from Triton, on purpose") == \
        "where-we-differ-from-triton-on-purpose"


# --- README.md --------------------------------------------------------------------------

CI_COMMAND = ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]" && '
              '.venv/bin/python -m pytest -n 2')
SERVE_COMMAND = ('python3 -m venv .venv && .venv/bin/pip install ".[onnx,pipeline]" && '
                 '.venv/bin/mini-triton --model-repository model_repository')


def readme_blocks() -> list[str]:
    blocks, current, fence = [], [], None
    for line in README.read_text().splitlines():
        match = FENCE.match(line)
        if match and fence is None:
            fence, current = match[1][:3], []
        elif match and match[1].startswith(fence):
            fence = None
            blocks.append("\n".join(current).strip())
        elif fence is not None:
            current.append(line)
    return blocks


def test_readme_opens_with_the_name_one_sentence_and_the_two_commands():
    lines = README.read_text().splitlines()
    assert lines[0] == "# mini_triton"
    paragraph = lines[2]
    assert lines[1] == "" and lines[3] == "" and paragraph.endswith(".")
    assert paragraph.count(". ") == 0, "one sentence"
    assert readme_blocks() == [SERVE_COMMAND, CI_COMMAND]
    assert len(lines) < 150


def test_the_readme_test_command_is_cis():
    assert CI_COMMAND in (ROOT / ".ci" / "run").read_text()


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for _, target in links(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert missing == []


# --- the feature table ------------------------------------------------------------------

STATUSES = {"supported", "partial", "not yet"}
# The extensions Triton 2.51's server metadata lists.
TRITON_EXTENSIONS = {"classification", "sequence", "model_repository",
                     "model_repository(unload_dependents)", "schedule_policy",
                     "model_configuration", "system_shared_memory", "cuda_shared_memory",
                     "binary_tensor_data", "parameters", "statistics", "trace", "logging"}
# What the issue asks the table to cover, as words its rows must contain.
COVERED = ["HTTP", "gRPC", "model_repository", "`none`", "`poll`", "`explicit`", "s3://",
           "Python backend", "ONNX Runtime", "TensorRT", "Dynamic batching",
           "Sequence batching", "Ensembles", "Response cache", "warmup", "Rate limiter",
           "Batch inputs", "Implicit state", "Generate extension", "OpenAI", "Metrics",
           "Traces", "Logging", "TLS", "system_shared_memory", "cuda_shared_memory",
           "SageMaker", "Vertex AI"]


def feature_rows() -> list[dict]:
    text = README.read_text()
    section = text.partition("## What works today")[2].partition("\n## ")[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| feature") or "---" in line[:6]:
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        assert len(cells) == 4, line
        rows.append(dict(zip(("feature", "here", "notes", "tests"), cells)))
    return rows


def test_the_feature_table_covers_triton_and_says_supported_partial_or_not_yet():
    rows = feature_rows()
    assert len(rows) >= 25
    for row in rows:
        assert row["here"] in STATUSES, row
    features = " ".join(row["feature"] for row in rows)
    assert [word for word in COVERED if word not in features] == []


def test_supported_and_partial_rows_name_tests_that_exist():
    for row in feature_rows():
        named = re.findall(r"`(tests/[^`]+\.py)`", row["tests"])
        if row["here"] == "not yet":
            assert named == [], row
            continue
        assert named, f"{row['feature']}: which tests keep it true?"
        for path in named:
            assert (ROOT / path).is_file(), f"{row['feature']}: {path} does not exist"


def test_the_extensions_supported_are_the_ones_the_server_lists():
    from mini_triton.service import EXTENSIONS

    assert set(EXTENSIONS) <= TRITON_EXTENSIONS
    claimed = set()
    for row in feature_rows():
        named = set(re.findall(r"`([^`]+)`", row["feature"])) & TRITON_EXTENSIONS
        if row["here"] == "not yet":
            assert not named & set(EXTENSIONS), f"{row['feature']}: the server lists it"
        else:
            claimed |= named
    assert claimed == set(EXTENSIONS)


def test_the_flags_a_row_names_have_the_status_it_gives():
    for row in feature_rows():
        for flag in re.findall(r"`--([a-z0-9-]+)", row["feature"] + " " + row["notes"]):
            if flag not in BY_NAME:  # one of our own
                continue
            honoured = flag not in NOT_HONOURED
            if row["here"] == "supported":
                assert honoured, f"{row['feature']}: --{flag} is not honoured"
            if row["here"] == "not yet":
                assert not honoured, f"{row['feature']}: --{flag} is honoured now: update the table"


# --- flags and the dashboard ------------------------------------------------------------


def test_every_flag_the_server_honours_is_in_the_deployment_page():
    text = (DOCS / "deployment.md").read_text()
    missing = []
    for action in build_parser()._actions:
        names = [option for option in action.option_strings if option.startswith("--")]
        if not names or names[0] == "--help" or names[0][2:] in NOT_HONOURED:
            continue
        if not any(f"`{name}" in text or f", {name}" in text for name in names):
            missing.append(names[0])
    assert missing == []


def test_every_dashboard_panel_is_explained_in_observability():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" /
                            "mini-triton.json").read_text())

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    text = (DOCS / "observability.md").read_text()
    missing = [p["title"] for p in panels(dashboard["panels"]) if p["title"] not in text]
    assert missing == []


# --- the config field table -------------------------------------------------------------

STATUS_WORDS = {HONOURED: "honoured", WARNED: "warned about", IRRELEVANT: "no effect here"}
# When a field is warned about only in some cases (Coverage.applies), in words.
WHEN = {"_is_gpu_kind": "`KIND_GPU` on a machine without a GPU",
        "_without_gpu": "on a machine without a GPU",
        "_stateless_backend": "for a backend other than onnxruntime, pytorch and identity"}


def config_field_table() -> str:
    """Every ModelConfig field, grouped by its top-level field and what happens to it."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for path, coverage in FIELDS.items():
        note = coverage.note
        if coverage.applies is not None:
            when = WHEN.get(coverage.applies.__name__, f"where `{coverage.applies.__name__}`")
            note = f"only {when}: {note}"
        rows.setdefault((path.split(".")[0], coverage.status, note), []).append(path)
    order = list(STATUS_WORDS)
    lines = ["| field | here | what happens |", "|---|---|---|"]
    for (_, status, note), paths in sorted(rows.items(), key=lambda r: order.index(r[0][1])):
        lines.append(f"| {_fields_cell(paths)} | {STATUS_WORDS[status]} | {note} |")
    return "\n".join(lines) + "\n"


def _fields_cell(paths: list[str]) -> str:
    """`a` and its `b`, `b.c` for a field with the fields inside it."""
    roots = [p for p in paths if not any(p.startswith(q + ".") for q in paths)]
    parts = []
    for root in roots:
        inner = [p[len(root) + 1:] for p in paths if p.startswith(root + ".")]
        parts.append(f"`{root}`" + (" and its " + ", ".join(f"`{i}`" for i in inner)
                                     if inner else ""))
    return "; ".join(parts)


def page_with_field_table(text: str) -> str:
    head, _, rest = text.partition(FIELDS_BEGIN)
    _, _, tail = rest.partition(FIELDS_END)
    return head + FIELDS_BEGIN + config_field_table() + FIELDS_END + tail


def test_the_config_field_table_is_coverages():
    text = CONFIG_PAGE.read_text()
    assert FIELDS_BEGIN in text and FIELDS_END in text
    assert text == page_with_field_table(text), (
        "docs/model-repository.md's config field table differs from "
        "mini_triton/config/coverage.py: run `python tests/test_docs_links.py`")


if __name__ == "__main__":
    CONFIG_PAGE.write_text(page_with_field_table(CONFIG_PAGE.read_text()))

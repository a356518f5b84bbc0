"""The docs name only what exists: module paths resolve to files of the tree, inventory keys are keys
the inventory schema takes (asked of the validator itself), every benchmark row names a script that
exists and keeps docs/benchmarks.md's format, and what CONTRIBUTING says of CI is what ``.ci/run`` does."""

from __future__ import annotations

import re
from functools import cache
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from mscon.console.config import schema
from mscon.console.config.inventory import InventoryError, load_inventory

import mscon_resume

# The repository's own top-level folders: a path starting with one of them names a file of the tree.
ROOTS = ("console", "agent", "mscon_resume", "trainer", "bench", "tests", "examples", "inventory", "docs")
# Paths the docs name that belong to another project, each with why.
FOREIGN = {
    "docs/sample_code/startup_method/net.py": "MindSpore's msrun tutorial sample, in MindSpore's repository",
}
BENCH_COLUMNS = ["what", "command", "quiet", "loaded", "date", "commit"]
_PY = re.compile(r"(?<![\w/.<*-])((?:\.\./)?[\w-]+(?:/[\w.-]+)*\.py)\b")
_DATA = re.compile(rf"(?<![\w/.-])((?:{'|'.join(ROOTS)})/[\w./-]+\.(?:yaml|toml|json|sbatch|md))\b(?!:\d)")
_FOLDER = re.compile(rf"`((?:{'|'.join(ROOTS)})/(?:[\w.-]+/)*)`")
_SCRIPT_ARG = re.compile(r"(?:python3?|--)\s+$")  # what follows is the user's script, not ours
_KEY = re.compile(r"(?<![\w/.-])([a-z_]+(?:\.[a-z_]+)+)\b(?![\w/-])")
_NAME_IN = re.compile(r"`([\w/.-]+\.py)`(?:'s)? \(?`([A-Za-z_]\w*)[\w.]*`")
_FILE_EXT = {"py", "md", "json", "jsonl", "yaml", "toml", "sbatch", "log", "txt", "svg", "sh", "gz", "err"}


def doc_pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


@cache
def tree_files() -> tuple[str, ...]:
    """Every file under the repository's own folders, as a path relative to the repository."""
    files: list[str] = []
    for root in ROOTS:
        files += [p.relative_to(REPO).as_posix() for p in (REPO / root).rglob("*") if p.is_file()]
    return tuple(f for f in files if "__pycache__" not in f)


def resolves(token: str, page: Path) -> bool:
    """``token`` names a file or folder of the tree: from the page's folder, from the repository's
    root, or as the short form the docs use inside a folder (``history/recording.py``, ``local.py``)."""
    if (page.parent / token).exists() or (REPO / token).exists():
        return True
    return any(f.endswith("/" + token) for f in tree_files())


def without_urls(text: str) -> str:
    return re.sub(r"https?://\S+", "", text)


def stale_paths(page: Path, text: str) -> list[str]:
    text = without_urls(text)
    named = [m for m in _PY.finditer(text) if not _SCRIPT_ARG.search(text[: m.start()][-12:])]
    tokens = [m.group(1) for m in named] + _DATA.findall(text) + _FOLDER.findall(text)
    return [f"{page.name}: {t}" for t in tokens if t not in FOREIGN and not resolves(t, page)]


def missing_names(page: Path, text: str) -> list[str]:
    """A name the docs place in a file (`` `agent/tail.py` (`parse_metrics_line`) ``, `` `x.py`'s `Y` ``)
    is defined there: a def, a class or an assignment."""
    missing = []
    for path, name in _NAME_IN.findall(text):
        files = (
            [REPO / path]
            if (REPO / path).exists()
            else [REPO / f for f in tree_files() if f.endswith("/" + path)]
        )
        defined = re.compile(rf"(?m)^\s*(?:(?:async )?def|class) {name}\b|^{name}\s*[:=]")
        if not any(defined.search(f.read_text()) for f in files):
            missing.append(f"{page.name}: {path} {name}")
    return missing


def layout_rows(text: str) -> list[tuple[str, list[str]]]:
    """docs/architecture.md's layout table: (folder, the modules its third column names)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`[\w/]+/`", cells[0]):
            rows.append((cells[0].strip("`"), re.findall(r"`([\w]+/?)`", cells[2])))
    return rows


def missing_layout_modules(text: str) -> list[str]:
    missing = []
    for folder, modules in layout_rows(text):
        for m in modules:
            target = REPO / folder / m if m.endswith("/") else REPO / folder / f"{m}.py"
            if not target.exists():
                missing.append(f"{folder}{m}")
    return missing


def named_keys(text: str) -> set[str]:
    """The inventory keys a page names: dotted names whose first part is a top-level key of the
    schema (``restart.standby``), not file names (``checks.py``, ``slurm-job.sbatch``)."""
    keys = set()
    for key in _KEY.findall(without_urls(text)):
        parts = key.split(".")
        if parts[0] in schema._TOP and parts[-1] not in _FILE_EXT:
            keys.add(key)
    return keys


def unknown_keys(keys: set[str], tmp_path: Path) -> list[str]:
    """The keys the inventory validator calls unknown: each is set (to null) in a small valid
    inventory, and only an "unknown key" error naming that very field counts against it."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    unknown = []
    for key in sorted(keys):
        doc: dict = {"name": "t", "device_target": "CPU", "nodes": [{"host": "a", "devices": 1}]}
        doc["job"] = {"script": "train.py"}
        section, *rest = key.split(".")
        if section == "nodes":
            where, field = doc["nodes"][0], "nodes[0]." + ".".join(rest)
        else:
            where, field = doc.setdefault(section, {}), key
        if not isinstance(where, dict):  # a key under a scalar (name, device_target): none exists
            unknown.append(key)
            continue
        for part in rest[:-1]:
            where = where.setdefault(part, {})
        where[rest[-1]] = None
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump(doc))
        try:
            load_inventory(path)
        except InventoryError as exc:
            if any(e.field == field and e.message.startswith("unknown key") for e in exc.all):
                unknown.append(key)
    return unknown


def github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def bench_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Each table of docs/benchmarks.md: its heading, its header cells and its rows' cells."""
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    heading, in_table = "", False
    for line in text.splitlines():
        if line.startswith("#"):
            heading, in_table = line.lstrip("#").strip(), False
        elif line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not in_table:
                tables.append((heading, cells, []))
                in_table = True
            elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
                tables[-1][2].append(cells)
        else:
            in_table = False
    return tables


def bench_row_problems(heading: str, header: list[str], rows: list[list[str]]) -> list[str]:
    page = REPO / "docs" / "benchmarks.md"
    problems = [] if header == BENCH_COLUMNS else [f"{heading}: columns {header}, not {BENCH_COLUMNS}"]
    for cells in rows:
        where = f"{heading}: {cells[0] if cells else '(empty row)'}"
        if len(cells) != len(BENCH_COLUMNS):
            problems.append(f"{where}: {len(cells)} cells")
            continue
        row = dict(zip(BENCH_COLUMNS, cells, strict=True))
        code = " ".join(re.findall(r"`([^`]+)`", row["command"]))
        scripts = re.findall(r"(?<![\w/.-])([\w/.-]+\.py)\b", code)
        modules = re.findall(r"-m\s+([\w.]+)", code)
        if not scripts and not modules:
            problems.append(f"{where}: the command names no script")
        problems += [f"{where}: {s} does not exist" for s in scripts if not resolves(s, page)]
        problems += [f"{where}: module {m} does not exist" for m in modules if find_spec(m) is None]
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]):
            problems.append(f"{where}: date {row['date']!r}")
        if not re.search(r"\b[0-9a-f]{7,40}\b", row["commit"]):
            problems.append(f"{where}: commit {row['commit']!r}")
        if not row["quiet"] or not row["loaded"]:
            problems.append(f"{where}: an empty result (write 'not measured')")
    return problems


def test_module_paths_named_in_the_docs_exist() -> None:
    stale = [s for page in doc_pages() for s in stale_paths(page, page.read_text())]
    assert stale == [], f"paths the docs name that are not in the tree: {stale}"


def test_names_placed_in_a_file_are_defined_there() -> None:
    named = [m for page in doc_pages() for m in _NAME_IN.findall(page.read_text())]
    assert len(named) >= 3, "no `file.py` `name` pairs found any more"
    assert [m for page in doc_pages() for m in missing_names(page, page.read_text())] == []


def test_the_layout_table_names_modules_that_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    assert len(layout_rows(text)) >= 10, "docs/architecture.md's layout table was not found"
    assert missing_layout_modules(text) == []


def test_inventory_keys_named_in_the_docs_exist(tmp_path: Path) -> None:
    keys = set().union(*(named_keys(p.read_text()) for p in doc_pages()))
    assert {"restart.standby", "hang.timeout_s", "job.metrics.pattern"} <= keys, "keys no longer found"
    assert unknown_keys(keys, tmp_path) == []


def test_every_benchmark_row_names_a_script_that_exists_in_the_format() -> None:
    text = (REPO / "docs" / "benchmarks.md").read_text()
    tables = bench_tables(text)
    assert len(tables) >= 15 and sum(len(rows) for _, _, rows in tables) >= 40
    problems = [p for table in tables for p in bench_row_problems(*table)]
    assert problems == []
    headings = {github_slug(h) for h in re.findall(r"(?m)^#+ (.+)$", text)}
    index = re.findall(r"\]\(#([^)]+)\)", text)
    assert index and [a for a in index if a not in headings] == []


def test_what_contributing_says_of_ci_and_lint_is_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    says_no_lint = "CI does not run it" in (REPO / "CONTRIBUTING.md").read_text()
    assert says_no_lint == ("ruff" not in ci)


def test_the_packaging_list_is_not_public_api() -> None:
    assert "FILES" not in mscon_resume.__all__
    assert "__init__.py" in mscon_resume.FILES  # still there for the bundle that ships the library


# Each checker finds a planted stale name (so none of the tests above passes by finding nothing).
@pytest.mark.parametrize(
    "planted",
    ["the recorder is `headless/recorder.py`", "see agent/detached.py", "`console/views/recorder/`"],
)
def test_a_stale_path_is_found(planted: str) -> None:
    assert stale_paths(REPO / "docs" / "x.md", f"{planted}\n`history/recording.py`, `local.py`") != []
    assert stale_paths(REPO / "docs" / "x.md", "`history/recording.py`, `local.py`, `python train.py`") == []


def test_a_stale_key_and_layout_module_are_found(tmp_path: Path) -> None:
    keys = named_keys("`restart.spares`, `restart.standby`, `job.metrics.pattern`, `nodes.python`, checks.py")
    assert keys == {"restart.spares", "restart.standby", "job.metrics.pattern", "nodes.python"}
    assert unknown_keys(keys | {"nodes.gpus", "job.metrics.regex"}, tmp_path) == [
        "job.metrics.regex",
        "nodes.gpus",
        "restart.spares",
    ]
    table = "| `console/views/headless/` | the view | `reporter`, `recorder` |\n"
    assert missing_layout_modules(table) == ["console/views/headless/recorder"]


def test_a_name_in_the_wrong_file_is_found() -> None:
    text = "`agent/tail.py` (`parse_metrics_line`), `mscon_resume/metrics.py`'s `MetricsWriter.write`"
    assert missing_names(REPO / "docs" / "x.md", text) == []
    assert missing_names(REPO / "docs" / "x.md", "`agent/metrics.py` (`parse_metrics_line`)") != []


def test_a_bad_benchmark_row_is_found() -> None:
    command = "`.venv/bin/python bench/launch.py --repeat 3`"
    good = ["x", command, "1 s", "not measured", "2026-11-29", "abc1234"]
    assert bench_row_problems("h", BENCH_COLUMNS, [good]) == []
    gone = [good[0], "`.venv/bin/python bench/launch_old.py`", *good[2:]]
    undated = [*good[:4], "today", good[5]]
    no_module = [good[0], "`.venv/bin/python -m mscon_resume.checks`", *good[2:]]
    assert len(bench_row_problems("h", BENCH_COLUMNS, [gone, undated, no_module])) == 3

"""The resume catalogue (issue 42, "exact or loud"): short user-style MindSpore scripts in
``tests/resume_catalogue/``, one a pattern users write, each with mscon_resume's lines as
docs/resume.md says. Each script's docstring says what the library owes it:

- ``EXPECT: exact``: killed and relaunched with ``MSCON_RESUME=1``, it computes and prints what
  the uninterrupted run did (``python -m mscon_resume.check``: "resumes exactly");
- ``EXPECT: refused``: the library cannot restore its state, so the relaunch refuses in one line
  before its first step ("refused:");
- ``EXPECT: differs``: a script that cannot repeat itself (``nn.Dropout`` on CPU): the check must
  find the divergence ("differs:");
- ``EXPECT: fails``: a use the library can tell wrong at once (``batches`` given an iterator): the
  first launch stops with one line, before any step ("the script fails uninterrupted").

``PATTERN:`` names the issue's pattern (1-12, or ``base`` for the docs' own shapes); ``RANKS: 2``
runs it under msrun (2 ranks); ``AT:`` the step the check kills the second run at (13 unless
said; past the end for the scripts that fail by themselves, in their second launch: they count
their launches in ``launches.txt``, which each check's folder holds). Pattern 11 (a 2-rank run relaunched
on 1 rank) is not the check's case: its test launches msrun itself.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import REPO, free_port, needs_mindspore, wait_for
from mscon.console.engine.plan import MINDSPORE_TIMERS

CATALOGUE = REPO / "tests" / "resume_catalogue"
DEFAULT_AT = 13
VERDICTS = {
    "exact": "resumes exactly",
    "refused": "refused:",
    "differs": "differs:",
    "fails": "the script fails uninterrupted",
}
PATTERNS = {str(n) for n in range(1, 13)} | {"base"}
FIELD = re.compile(r"^(EXPECT|PATTERN|RANKS|AT|SUITE): *(\S+) *$", re.M)
# `SUITE: slow` scripts repeat a pattern another script checks (a GRAPH_MODE twin, a second 2-rank
# run); the README's test command leaves them out, saying so, to stay within its 12 minutes.
SLOW = "MSCON_SLOW_TESTS"
RANK_COUNT = "11"  # the pattern the check does not run: a relaunch on another rank count


@dataclass(frozen=True)
class Entry:
    path: Path
    expect: str
    pattern: str
    ranks: int
    at: int
    graph: bool
    slow: bool = False

    @property
    def name(self) -> str:
        return self.path.stem


def read_entry(path: Path) -> Entry:
    source = path.read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    fields = dict(FIELD.findall(doc))
    assert fields.get("EXPECT") in VERDICTS, f"{path.name}: no EXPECT: exact|refused|differs|fails line"
    assert fields.get("PATTERN") in PATTERNS, f"{path.name}: no PATTERN: 1-12|base line"
    return Entry(
        path,
        fields["EXPECT"],
        fields["PATTERN"],
        int(fields.get("RANKS", "1")),
        int(fields.get("AT", str(DEFAULT_AT))),
        "mode=ms.GRAPH_MODE" in source,
        fields.get("SUITE") == "slow",
    )


ENTRIES = [read_entry(p) for p in sorted(CATALOGUE.glob("*.py"))]
CHECKED = [e for e in ENTRIES if e.pattern != RANK_COUNT]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MS_", "RANK_", "MSCON_"))}
    env["GLOG_v"] = "3"  # MindSpore's C++ log: errors only
    # the check runs msrun and msrun starts `python` from PATH: this one
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


# ------------------------------------------------------------------ the catalogue itself (no MindSpore)


def test_the_catalogue_covers_every_pattern_of_the_issue() -> None:
    assert len(ENTRIES) >= 32
    by_pattern: dict[str, set[str]] = {}
    for e in ENTRIES:
        by_pattern.setdefault(e.pattern, set()).add(e.expect)
    missing = [str(n) for n in range(1, 13) if str(n) not in by_pattern]
    assert not missing, f"patterns without a script: {missing}"
    # where the issue lists a variant the library must refuse, both sides are there
    for pattern in ("2", "3", "4", "5", "6"):
        assert {"exact", "refused"} <= by_pattern[pattern], pattern
    assert by_pattern["10"] == {"fails"} and by_pattern["11"] == {"refused"}
    # nothing differs but what cannot repeat itself uninterrupted (nn.Dropout on CPU)
    assert [e.name for e in ENTRIES if e.expect == "differs"] == ["dropout_net"]
    assert len({e.pattern for e in ENTRIES if e.graph}) >= 3  # GRAPH_MODE variants of 3 patterns
    assert len([e for e in CHECKED if e.ranks == 2 and e.expect == "exact"]) >= 2
    assert {"base"} <= set(by_pattern)


def test_every_script_says_what_a_user_would_be_let_down_by() -> None:
    for e in ENTRIES:
        doc = ast.get_docstring(ast.parse(e.path.read_text())) or ""
        assert "let down" in " ".join(doc.split()), e.name
        assert "import mscon_resume" in e.path.read_text(), e.name
        assert e.at > 1, e.name


# ------------------------------------------------------------------ the check, script by script


class CheckServer:
    """One ``python -m mscon_resume.check --serve`` for the one-rank scripts of this worker: MindSpore
    is imported once, and each check's three runs are forks of it (about 2.5 s a check saved)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def ask(self, argv: list[str], cwd: Path) -> tuple[int, str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mscon_resume.check", "--serve"], env=_env(), text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # the check's own --timeout bounds each of its runs
        if not line:
            self.proc = None
            return -1, "(the check server died)"
        answer = json.loads(line)
        return int(answer["code"]), str(answer["stdout"])

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def check_server() -> Iterator[CheckServer]:
    server = CheckServer()
    yield server
    server.close()


def _group(e: Entry, i: int) -> list[pytest.MarkDecorator]:
    # The catalogue's cost split between the two MindSpore groups of tests/conftest.py, a script
    # each in turn (one module in one group was 4 minutes more on that group's path).
    # A 2-rank check (msrun, about 45 s) goes to group b (tests/conftest.py balances the rest).
    group = "b" if e.ranks > 1 else "ab"[i % 2]
    marks = [pytest.mark.mindspore(ranks=e.ranks), pytest.mark.xdist_group(f"mindspore-{group}")]
    if e.slow and not os.environ.get(SLOW):
        marks.append(
            pytest.mark.skip(reason=f"SUITE: slow (a twin of another entry's pattern): {SLOW}=1 runs it")
        )
    return marks


@needs_mindspore
@pytest.mark.parametrize(
    "entry", [pytest.param(e, id=e.name, marks=_group(e, i)) for i, e in enumerate(CHECKED)]
)
def test_the_check_gives_the_verdict_the_script_expects(
    entry: Entry, tmp_path: Path, check_server: CheckServer
) -> None:
    argv = ["--at", str(entry.at), "--timeout", "150"]
    argv += [] if entry.ranks == 1 else ["--nproc", str(entry.ranks)]
    argv += ["--", str(entry.path)]
    # The user's folder. The check runs each run in a folder of its own linking this one's files:
    # the scripts that fail by themselves count their launches in this shared file (a second launch
    # without MSCON_RESUME is the one the check would kill).
    (tmp_path / "launches.txt").write_text("0")
    if entry.ranks == 1:
        _, out = check_server.ask(argv, tmp_path)
        err = ""
    else:
        cmd = [sys.executable, "-m", "mscon_resume.check", *argv]
        p = subprocess.run(
            cmd, cwd=tmp_path, env=_env(**MINDSPORE_TIMERS), capture_output=True, text=True, timeout=560
        )
        out, err = p.stdout, p.stderr
    verdict = out.splitlines()[0] if out.strip() else "(no verdict)"
    told = f"{entry.name} (pattern {entry.pattern}, EXPECT {entry.expect}): {out}\n{err[-3000:]}"
    assert verdict.startswith(VERDICTS[entry.expect]), told
    if entry.expect == "differs":  # a divergence the relaunch computed, not a relaunch that crashed
        assert "relaunched: exit 0," in out, told


# ------------------------------------------------------------------ pattern 11: another rank count

RANK_COUNT_SCRIPT = CATALOGUE / "rank_count_2_to_1.py"
KILL_AT = 13  # both ranks past it: mid-epoch 1 of 3 (8 steps an epoch)


def _msrun(work: Path, ranks: int, log_dir: str, state: Path, resume: bool) -> subprocess.Popen[bytes]:
    env = _env(MSCON_STATE_DIR=str(state), MSCON_METRICS=str(work / f"{log_dir}_metrics_{{rank}}.jsonl"))
    env.update(MINDSPORE_TIMERS)  # MindSpore's cluster timers at 1 s, as mscon sets them
    if resume:
        env["MSCON_RESUME"] = "1"
    return subprocess.Popen(
        ["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}", f"--master_port={free_port()}",
         "--join=True", f"--log_dir={log_dir}", str(RANK_COUNT_SCRIPT)],
        cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _top_step(metrics: Path) -> int:
    top = 0
    with contextlib.suppress(OSError):
        for line in metrics.read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                step = json.loads(line).get("step")
                if isinstance(step, int) and not isinstance(step, bool):
                    top = max(top, step)
    return top


def _has_snapshot(shm: Path, rank: int) -> bool:
    from mscon_resume import store

    return any(any(Path(f).glob(f"**/rank_{rank}/*")) for f in store.alternates(str(shm)))


def _kill_everything_in(work: Path) -> None:
    """msrun, its workers (each in a session of its own) and the ``tail -f`` it keeps on their logs."""
    for p in psutil.process_iter(["cwd"]):
        if p.info["cwd"] == str(work) and p.pid != os.getpid():
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.mark.mindspore(ranks=2)
@pytest.mark.xdist_group("mindspore-a")  # the catalogue's 2-rank checks are b's
@needs_mindspore
def test_a_2_rank_run_relaunched_on_1_rank_is_refused_in_one_line(tmp_path: Path) -> None:
    if shutil.which("msrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("msrun is not beside this python")
    from mscon_resume import store

    assert read_entry(RANK_COUNT_SCRIPT).expect == "refused"
    state = tmp_path / "state"
    shm = Path(store.shm_folder(str(state)))
    first = _msrun(tmp_path, 2, "first", state, resume=False)
    try:
        wait_for(
            lambda: (
                min(_top_step(tmp_path / f"first_metrics_{r}.jsonl") for r in (0, 1)) >= KILL_AT
                or first.poll() is not None
            ),
            180,
            f"both ranks past step {KILL_AT}",
        )
        assert first.poll() is None, "the 2-rank run ended before it could be killed"
        wait_for(lambda: all(_has_snapshot(shm, r) for r in (0, 1)), 60, "both ranks' snapshots")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
        _kill_everything_in(tmp_path)
        first.wait(timeout=30)
    try:
        relaunch = _msrun(tmp_path, 1, "second", state, resume=True)
        try:
            code = relaunch.wait(timeout=240)
        finally:
            _kill_everything_in(tmp_path)
        log = (tmp_path / "second" / "worker_0.log").read_text(errors="replace")
        refusals = [line for line in log.splitlines() if "refuses to resume" in line]
        assert len(refusals) == 1, log[-3000:]
        assert refusals[0].startswith("mscon_resume: rank 0 refuses to resume: "), refusals
        assert ";" in refusals[0], refusals  # <what>; <fix>
        assert not re.search(r"^rank 0 epoch \d+ step", log, re.M), "the refused relaunch trained"
        assert code != 0
    finally:
        for folder in store.alternates(str(shm)):
            shutil.rmtree(folder, ignore_errors=True)

"""agent/tail.py: the rank-log reader keeps every line, however much is left when a rank exits."""

from __future__ import annotations

from pathlib import Path

from mscon.agent.tail import FileTail, parse_loss_line


def test_final_read_returns_everything_left_beyond_the_running_bound(tmp_path: Path) -> None:
    # A rank that prints ~10 MiB and exits before the agent's next poll: the running reads are
    # bounded (4 MiB), the final one must take the rest (it once stopped at 4 MiB too).
    log = tmp_path / "r0.log"
    lines = [f"line {i:07d} " + "x" * 90 for i in range(100_000)]
    log.write_text("\n".join(lines) + "\n")
    tail = FileTail(str(log))
    first = tail.read_lines()
    assert 0 < len(first) < len(lines)  # bounded while running
    rest = tail.read_lines(final=True)
    assert first + rest == lines


def test_partial_lines_wait_for_their_newline_until_the_end(tmp_path: Path) -> None:
    log = tmp_path / "r0.log"
    log.write_bytes(b"epoch: 1 step: 1, loss is 2.5\nhalf a li")
    tail = FileTail(str(log))
    assert tail.read_lines() == ["epoch: 1 step: 1, loss is 2.5"]
    with log.open("ab") as f:
        f.write(b"ne\r\nno newline at exit")
    assert tail.read_lines() == ["half a line"]
    assert tail.read_lines(final=True) == ["no newline at exit"]
    assert parse_loss_line("epoch: 1 step: 1, loss is 2.5") == (1, 1, 2.5)


def test_a_missing_file_is_no_lines_yet(tmp_path: Path) -> None:
    assert FileTail(str(tmp_path / "not-yet.log")).read_lines() == []

"""What each kind of job gets added to an attempt's command line (console/engine/job_kinds.py)."""

from __future__ import annotations

from mscon.console.engine.job_kinds import attempt_argv, is_trainer, restart_note

TRAINER = "trainer/train.py"
SCRIPT = "train_net.py"
BASE = ("python3", "-u", "trainer/train.py", "--epochs", "2")
CKPT = "/runs/r1/node0/checkpoints"
RESUME = ("--resume-from", "latest")


def test_the_trainer_is_told_apart_from_a_user_script() -> None:
    assert is_trainer("trainer/train.py")
    assert is_trainer("/work/job/trainer/train.py")
    assert is_trainer("job\\trainer\\train.py")
    assert not is_trainer("train.py")
    assert not is_trainer("mytrainer/train.py")
    assert not is_trainer("trainer/train_net.py")


def test_trainer_keeps_checkpoints_and_snapshots_when_a_restart_may_come() -> None:
    argv = attempt_argv(BASE, TRAINER, 0, True, CKPT, RESUME)
    assert argv == (*BASE, "--checkpoint-dir", CKPT, "--snapshot-every", "1")


def test_trainer_resumes_from_the_second_attempt_on() -> None:
    for number in (1, 2):
        argv = attempt_argv(BASE, TRAINER, number, True, CKPT, RESUME)
        assert argv == (*BASE, "--checkpoint-dir", CKPT, "--snapshot-every", "1", "--resume")
    assert "--resume-from" not in attempt_argv(BASE, TRAINER, 1, True, CKPT, RESUME)


def test_trainer_gets_nothing_when_no_restart_may_come() -> None:
    assert attempt_argv(BASE, TRAINER, 0, False, CKPT, RESUME) == BASE
    # an operator's restart with no budget: no checkpoints were kept, so nothing to resume from
    assert attempt_argv(BASE, TRAINER, 1, False, CKPT, RESUME) == BASE


def test_trainer_arguments_the_user_gave_are_kept() -> None:
    given = (*BASE, "--checkpoint-dir", "/mine", "--snapshot-every", "5")
    assert attempt_argv(given, TRAINER, 0, True, CKPT, RESUME) == given
    assert attempt_argv(given, TRAINER, 1, False, CKPT, RESUME) == (*given, "--resume")
    resumed = (*given, "--resume")
    assert attempt_argv(resumed, TRAINER, 1, True, CKPT, RESUME) == resumed


def test_user_script_gets_resume_args_from_attempt_one_on() -> None:
    base = ("python3", "-u", SCRIPT, "--lr", "0.1")
    assert attempt_argv(base, SCRIPT, 0, True, CKPT, RESUME) == base
    assert attempt_argv(base, SCRIPT, 1, True, CKPT, RESUME) == (*base, *RESUME)
    assert attempt_argv(base, SCRIPT, 3, False, CKPT, RESUME) == (*base, *RESUME)
    assert attempt_argv(base, SCRIPT, 2, True, CKPT, ()) == base


def test_restart_note_only_for_a_trainer_without_checkpoints() -> None:
    assert "starts from step 0" in restart_note(TRAINER, False, ("--epochs", "2"))
    assert restart_note(TRAINER, True, ()) == ""
    assert restart_note(TRAINER, False, ("--checkpoint-dir", "/mine")) == ""
    assert restart_note(SCRIPT, False, ()) == ""

"""The kinds of job a run starts, and what each adds to an attempt's command line: the reference
trainer (trainer/train.py: the console gives it a checkpoint folder, a snapshot every step and
``--resume`` on a restart) and a user's script (the inventory's ``job.resume_args`` on a restart).
"""

from __future__ import annotations

from pathlib import PurePosixPath


def is_trainer(script: str) -> bool:
    """The reference trainer (``.../trainer/train.py``, either slash), rather than a user's script."""
    return PurePosixPath(script.replace("\\", "/")).parts[-2:] == ("trainer", "train.py")


def attempt_argv(
    spec_argv: tuple[str, ...],
    script: str,
    number: int,
    restart_may_come: bool,
    checkpoint_folder: str,
    resume_args: tuple[str, ...],
) -> tuple[str, ...]:
    """Attempt ``number``'s command line for a rank started as ``spec_argv``: resume where the
    previous attempt left off. ``restart_may_come``: a restart budget or an operator who may press
    r (see ``Supervisor._restart_may_come``); ``checkpoint_folder``: the trainer's, on its node."""
    argv = spec_argv
    if is_trainer(script):
        # Only with a restart budget: checkpoints cost time (and would skew bench/trainer.py).
        if restart_may_come and "--checkpoint-dir" not in argv:
            argv += ("--checkpoint-dir", checkpoint_folder)
        if restart_may_come and "--snapshot-every" not in argv:
            # A state copy in node memory every step: a restart resumes at the last step.
            argv += ("--snapshot-every", "1")
        if number > 0 and "--checkpoint-dir" in argv and "--resume" not in argv:
            argv += ("--resume",)
    elif number > 0:
        argv += resume_args
    return argv


def restart_note(script: str, restart_may_come: bool, args: tuple[str, ...]) -> str:
    """What a restart's line adds for a job that starts over from step 0: the trainer given no
    checkpoint folder (none is added without a restart budget), else nothing."""
    if is_trainer(script) and not restart_may_come and "--checkpoint-dir" not in args:
        return "; the trainer has no checkpoints (no --checkpoint-dir): it starts from step 0"
    return ""

"""``mscon init``: write a commented inventory for the user to keep, so a pip-installed mscon needs no
checkout. It starts from the shipped sample for the device target (``mscon/inventory/*.yaml``, found
as ``load_inventory_or_default`` finds ``local.yaml``), takes the nodes from ``--hosts``/``--hostfile``
and the job from the script after ``--`` where given, and writes only what differs from the model's
defaults, with the rest as commented examples. The file is loaded back before it takes its name, so
what is written always passes ``mscon validate``; an existing file is kept unless ``--force``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from mscon.console.cli.job_flags import add_adhoc_flags, adhoc_flags
from mscon.console.cli.usage import usage_error
from mscon.console.cli.workdir import script_in_workdir, workdir_of
from mscon.console.config.adhoc import AdhocError, AdhocFlags, apply_flags
from mscon.console.config.adhoc import build_inventory as adhoc_inventory
from mscon.console.config.domains import LABEL_RE
from mscon.console.config.inventory import InventoryError, load_inventory
from mscon.console.config.limits import MAX_NAME
from mscon.console.config.model import (
    Inventory,
    JobSpec,
    NodeSpec,
    SchedulerSpec,
)
from mscon.console.engine import exit_codes

DEFAULT_PATH = "mscon.yaml"
# The shipped sample each device target starts from (its defaults, its job for the shipped trainer).
SAMPLES = {"CPU": "local.yaml", "GPU": "two-node.yaml", "Ascend": "ascend910x8.yaml"}
# Node fields that move to ``defaults`` when every node has the same value.
_SHARED = ("user", "port", "python", "identity_file")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    init = sub.add_parser(
        "init",
        help="write a commented inventory to keep (from --hosts, or from a shipped sample)",
        description="Write an inventory file from the flags (the nodes of --hosts or --hostfile, the "
        "script after --) and the shipped sample for the device target, with comments. Refuses to "
        "overwrite a file unless --force. The file passes mscon validate.",
        usage="mscon init [PATH] [--force] [--hosts HOST,... --nproc-per-node N] [...] [-- SCRIPT [ARGS...]]",
    )
    init.add_argument("path", nargs="?", default=DEFAULT_PATH, metavar="PATH", help=f"default {DEFAULT_PATH}")
    init.add_argument("--force", action="store_true", help="overwrite PATH if it exists")
    init.add_argument(
        "--workdir",
        type=Path,
        help="the job's folder, synced to the nodes (default: the current folder when a script is given)",
    )
    add_adhoc_flags(init)


def init_main(args: argparse.Namespace, user_cmd: list[str] | None) -> int:
    out = Path(args.path)
    if out.is_dir():
        return _error(f"{out}: is a folder; give the file to write, e.g. {out / DEFAULT_PATH}")
    if (out.exists() or out.is_symlink()) and not args.force:
        return _error(f"{out}: already exists; mscon init --force overwrites it")
    if not out.parent.is_dir():
        return _error(f"{out}: no such folder: {out.parent}")
    flags = adhoc_flags(args)
    try:
        inv, sample = _inventory(args, flags, user_cmd, _name(out))
    except (AdhocError, InventoryError) as exc:
        return _error(str(exc))
    text = render(inv, out.parent.resolve(), sample, own_job=bool(user_cmd))
    try:
        _write_checked(out, text, args.force)
    except InventoryError as exc:  # a bug here, not the user's: say so rather than write it
        return _error(f"the inventory written for {out} does not load back ({exc}); nothing written")
    except FileExistsError:
        return _error(f"{out}: already exists; mscon init --force overwrites it")
    except OSError as exc:
        return _error(f"{out}: cannot write: {exc.strerror or exc}")
    ranks = f"{len(inv.nodes)} node(s), {inv.world_size} rank(s)"
    print(f"wrote {out} ({ranks}, from the sample {sample}): edit it, check it with mscon validate {out}")
    print(f"run it with: mscon run {out}   (mscon up {out}: in the live console)")
    return exit_codes.OK


def _error(message: str) -> int:
    return usage_error(message)


def _name(out: Path) -> str:
    stem = out.stem
    return stem if LABEL_RE.fullmatch(stem) and len(stem) <= MAX_NAME else "cluster"


def _inventory(
    args: argparse.Namespace, flags: AdhocFlags, user_cmd: list[str] | None, name: str
) -> tuple[Inventory, str]:
    """The inventory to write, and the sample it started from."""
    target = flags.device_target or "CPU"
    sample_name = SAMPLES[target]
    with resources.as_file(resources.files("mscon.inventory").joinpath(sample_name)) as p:
        sample = load_inventory(p)
    job = _job(args, user_cmd, sample.job)
    if flags.names_nodes:
        inv = adhoc_inventory(flags, job.workdir, job.script, job.args)
        inv = dataclasses.replace(inv, job=dataclasses.replace(job, env={**job.env, **inv.job.env}))
    else:
        inv = apply_flags(dataclasses.replace(sample, job=job), flags)
    return dataclasses.replace(inv, name=name, device_target=target), sample_name


def _job(args: argparse.Namespace, user_cmd: list[str] | None, sample: JobSpec) -> JobSpec:
    """The script after -- in the workdir (default: the current folder); without one, the sample's
    job in the current folder (a checkout holds its trainer). Never the installed package's folder:
    the workdir is the user's project, copied to every node, and must outlive an upgrade."""
    if not user_cmd:
        if args.workdir is not None:
            raise AdhocError("--workdir", "give the script too, after --: e.g. -- train.py")
        return _sample_job_here(sample)
    workdir = workdir_of(args.workdir)
    if workdir is None:
        raise AdhocError("--workdir", f"no such directory: {args.workdir}")
    script = script_in_workdir(user_cmd[0], workdir)
    if script is None:
        raise AdhocError("--", f"script {user_cmd[0]} is not a file inside the workdir {workdir}")
    return JobSpec(workdir=workdir, script=script, args=tuple(user_cmd[1:]))


def _sample_job_here(sample: JobSpec) -> JobSpec:
    """The sample's job with the current folder as its workdir, where that folder holds its script."""
    workdir = Path.cwd().resolve()
    if not (workdir / sample.script).is_file():
        raise AdhocError(
            "init",
            f"no script given, and the current folder (the job's workdir) holds no {sample.script}: "
            "give your script after --, e.g. mscon init --hosts a,b --nproc-per-node 8 -- train.py",
        )
    return dataclasses.replace(sample, workdir=workdir)


# ---------------------------------------------------------------------------------------- rendering


def render(inv: Inventory, folder: Path, sample: str, own_job: bool) -> str:
    """The inventory as commented YAML for a file in ``folder`` (relative paths resolve from there);
    ``own_job``: the user's script, not the sample's."""
    w = _Writer()
    w.comment(f"An mscon inventory, written by `mscon init` from the shipped sample {sample}.")
    w.comment("Edit it to your cluster; `mscon validate FILE` checks it offline, naming any wrong field.")
    w.comment("Keys left out take their defaults; the commented lines show the optional ones.")
    w.line(f"name: {_y(inv.name)}", "a label for the run's folders and summaries")
    w.line(
        f"device_target: {inv.device_target}", "GPU | Ascend | CPU: what the ranks use and preflight checks"
    )

    shared, nodes = _split_nodes(inv.nodes)
    # A defaults: with nothing under it would be null: then the whole section is an example.
    hash_ = "" if shared else "# "
    w.line(f"{hash_}defaults:", "applied to every node; a node's own keys win")
    if "python" not in shared:
        w.line("  # python: /path/to/venv/bin/python3", "default: python3 on the node's PATH")
    for key, value in shared.items():
        w.entry(f"  {key}", value, _NODE_NOTES.get(key, ""))
    if not {"user", "port", "identity_file"} & shared.keys():
        w.line("  # user, port, identity_file: as `ssh HOST` takes them from ~/.ssh/config unless set here")
    w.line("nodes:", "one per node; devices: its ranks; the first node runs MindSpore's scheduler")
    for node in nodes:
        w.line(f"  - {_y(node)}")

    sched = _changed(inv.scheduler, SchedulerSpec())
    sched["port"] = inv.scheduler.port  # always shown: it must be free on the first node
    w.line(f"scheduler: {_y(sched)}", "MindSpore's scheduler port (MS_SCHED_PORT) on the first node")

    job = inv.job
    if not own_job:
        w.comment("The sample's job (the trainer of an mscon checkout): put your own script and args")
    w.line("job:")
    w.line(f"  workdir: {_y(_path_text(job.workdir, folder))}", "synced to every node (no .git, venvs)")
    w.line(f"  script: {_y(job.script)}", "relative to workdir")
    w.line(f"  args: {_y(list(job.args))}")
    if job.env:
        w.entry("  env", dict(job.env), "every rank's environment")
    else:
        w.line("  # env: {DATA_PATH: /data}", "every rank's environment (the laptop's is not sent)")
    for key, value in (("exclude", job.exclude), ("resume_args", job.resume_args)):
        if value:
            w.line(f"  {key}: {_y(list(value))}")
    if job.metrics_pattern:
        w.line(f"  metrics: {_y({'pattern': job.metrics_pattern})}")
    for key, value in _changed(job, _DEFAULT_JOB).items():
        if key not in _JOB_WRITTEN:  # a job key this renderer has no line for: as the model names it
            w.line(f"  {key}: {_y(value)}")

    # The optional sections: what differs from the model's defaults, else a commented example.
    for f in dataclasses.fields(inv):
        spec = getattr(inv, f.name)
        if f.name in _NOT_SECTIONS or not dataclasses.is_dataclass(spec):
            continue
        example, note = _SECTIONS.get(f.name, ("", ""))
        changed = _changed(spec, type(spec)())
        if changed:
            w.line(f"{f.name}: {_y(changed)}", note)
        elif example:
            w.line(f"# {f.name}: {example}", note)
    return w.text()


_NODE_NOTES = {
    "python": "the interpreter with MindSpore, the same path on every node",
    "user": "the login on the nodes",
    "identity_file": "the SSH key",
    "env": "every rank's environment on these nodes",
}
_SECTIONS = {  # section: (a commented example, what it is for)
    "restart": ("{max_restarts: 2}", "restart every rank after a failure"),
    "hang": ("{timeout_s: 600}", "silent this long = hung (default: from its pace)"),
    "checks": ("{shm_min_gib: 8}", "preflight's limits"),
    "ssh": ("{config: ~/.ssh/config}", "default: what `ssh HOST` reads"),
    "stop": ("{grace_s: 5}", "seconds between SIGTERM and SIGKILL"),
}
_NOT_SECTIONS = {"path", "name", "device_target", "nodes", "job", "scheduler", "slurm"}
_JOB_WRITTEN = {"workdir", "script", "args", "env", "exclude", "resume_args", "metrics_pattern"}
_DEFAULT_JOB = JobSpec(workdir=Path("/"), script="")  # for the defaults of the optional job keys


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def comment(self, text: str) -> None:
        self.lines.append(f"# {text}")

    def line(self, text: str, note: str = "") -> None:
        self.lines.append(f"{text:<40}  # {note}" if note else text)

    def entry(self, key: str, value: Any, note: str = "") -> None:
        """``key: value`` on one line, or a mapping too long for one as a block below the key."""
        flow = f"{key}: {_y(value)}"
        if len(flow) <= 80 or not isinstance(value, dict):
            self.line(flow, note)
            return
        self.line(f"{key}:", note)
        pad = " " * (len(key) - len(key.lstrip()) + 2)
        for k, v in value.items():
            self.line(f"{pad}{_y(k)}: {_y(v)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _y(value: Any) -> str:
    """``value`` as one line of flow YAML, quoted where YAML would read it otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 5, as the samples write it, not 5.0
    elif isinstance(value, dict):
        return "{" + ", ".join(f"{_y(k)}: {_y(v)}" for k, v in value.items()) + "}" if value else "{}"
    dumped = yaml.safe_dump(value, default_flow_style=True, width=1 << 30, sort_keys=False).strip()
    return dumped.removesuffix("\n...").strip()


def _changed(spec: Any, default: Any) -> dict[str, Any]:
    """The fields of a section that differ from the model's defaults (written in model.py only)."""
    return {
        f.name: getattr(spec, f.name)
        for f in dataclasses.fields(spec)
        if getattr(spec, f.name) != getattr(default, f.name)
    }


def _split_nodes(nodes: tuple[NodeSpec, ...]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fields every node shares (for ``defaults``), and each node's own."""
    shared: dict[str, Any] = {}
    for key in _SHARED:
        values = {getattr(n, key) for n in nodes}
        if len(values) == 1 and None not in values:
            shared[key] = _home_relative(values.pop()) if key == "identity_file" else values.pop()
    envs = [n.env for n in nodes]
    if envs[0] and all(e == envs[0] for e in envs):
        shared["env"] = dict(envs[0])
    out = []
    for n in nodes:
        d: dict[str, Any] = {"host": n.host}
        if n.name != n.host:
            d["name"] = n.name
        d["devices"] = n.devices
        for key in ("transport", "user", "port", "python", "identity_file", "address"):
            value = getattr(n, key)
            if key not in shared and value is not None and value != getattr(NodeSpec, key, None):
                d[key] = value
        if n.env and "env" not in shared:
            d["env"] = dict(n.env)
        out.append(d)
    return shared, out


def _home_relative(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if home != "~" and path.startswith(home + os.sep) else path


def _path_text(workdir: Path, folder: Path) -> str:
    """Relative to the file's folder where one holds the other (the project moves as one); else
    absolute (a --workdir elsewhere)."""
    if workdir == folder or workdir.is_relative_to(folder) or folder.is_relative_to(workdir):
        return os.path.relpath(workdir, folder)
    return str(workdir)


def _write_checked(out: Path, text: str, force: bool) -> None:
    """Write ``text`` beside ``out``, load it back, then give it its name (never over a file unless
    ``force``)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        load_inventory(tmp)
        if force:
            os.replace(tmp, out)
        else:
            os.link(tmp, out)  # fails if out appeared meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

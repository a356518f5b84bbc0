"""MindSpore's own blame evidence: log lines in which MindSpore (the scheduler or a worker) or HCCL
names the rank that stopped responding.

``blame(line)`` returns ``Blame(ranks, kind, text)`` or None. ``ranks`` are the ranks the line
blames, strongest suspect first; ``kind`` says which message it was (``KIND_STRENGTH`` ranks the
kinds, higher is stronger); ``text`` is the line, stripped and cut to ``MAX_TEXT`` characters.
Lines that contain none of "timed out", "Timed out", "emote" (remote/Remote) or "peer rank" are
rejected by substring tests before any regex runs.

Message shapes covered, and where each comes from:

MindSpore dynamic cluster, scheduler side (``MetaServerNode::UpdateTopoState`` in
mindspore/ccsrc/distributed/cluster/topology/meta_server_node.cc, MindSpore 2.x). Node ids are the
workers' MS_NODE_ID values, which mscon sets to the global rank, so they are returned as ranks:

- ``first_timed_out`` (strongest), the exception the scheduler raises (also seen as a Python
  ``RuntimeError:`` line), when it names a single node::

      The total number of timed out node is 1. Timed out node list is: [const vector][1],
      worker 1 is the first one timed out, please check its log.

  ``[const vector][...]`` is how MindSpore prints a std::vector (``operator<<`` in
  mindspore/core/utils/overload.h); other list spellings (``[1, 3]``, ``{1 3}``, quoted ids,
  ``is :``) are accepted too.
- ``timed_out_list``: the same message naming several nodes (``[const vector][1, 3], worker 1 is
  the first one timed out``), or a list without the "first one" clause. ``ranks`` = the "first"
  worker, then the rest of the list. It is not ``first_timed_out`` because MindSpore's "first" is
  not a time order: the scheduler checks every node's heartbeat each ~3 s, throws on the first
  check that finds any node late, lists them in ``std::map<std::string, ...>`` order and calls
  element 0 "the first" -- the smallest node id *as a string* ("10" before "2") among the nodes
  found late in the same check. Use the exit times to choose among them.
- ``node_timed_out``, logged once per node before the exception::

      [ERROR] DISTRIBUTED(...) [.../meta_server_node.cc:...] UpdateTopoState] The node: 1 is timed
      out. It may exit with exception, please check this node's log.

  (``node: 1 is timed out`` without "The" is accepted as well.)

The worker side of the same failure (``ComputeGraphNode::Heartbeat`` in compute_graph_node.cc:
"The state of the cluster is error, total nodes num: 4, abnormal nodes num: 1") names no node, so
it is not evidence here.

HCCL (Ascend) error messages, printed in the Python exception text of the rank that waited. The
formats are CANN's error-code table (hicann/hcomm error-message registration, ``hcomm_g_msg``) and
the Ascend troubleshooting pages "EI0002 Communication Operation Timeout" / "EI0006 Get Socket
Timeout" (hiascend.com, maintenref/troubleshooting/atlaserrorcode_15_0242 and _0246); the recorded
lines in the tests are from GitHub issues (vllm-project/vllm-ascend #3413 and #486, hiyouga/
LlamaFactory #5071, vllm-project/vllm-ascend #3162):

- ``hccl_notify_timeout`` (EI0002), CANN 7/8.0: ``The Notify register has not received the Notify
  record from remote rank: [24]. ... task information: [notify id:[...], stage:[0], remote
  rank:[24]] ...``; older CANN: ``from remote rank [3]``; CANN 8.1+: ``A timeout occurs when the
  Notify register waits for execution. Waiting peer rank: 4; ...``. ``remote rank: [unknown]``
  names nobody and is not evidence.
- ``hccl_socket_timeout`` (EI0006, ``Getting socket times out. Reason: ...``): the documented
  reasons ("Remote Rank did not send the data in time", "srcRank (server ..., device ID 1) fails to
  connect to dstRank (...)") name no rank id; a line with EI0006 and a rank in any of the spellings
  ``remote rank id: 3``, ``remote_rank:[3]``, ``remote rank [3]`` is covered.
- ``hccl_sdma_error`` (EI0012): ``SDMA memory copy task exception occurred. Remote rank: 3. ...``
- ``hccl_transport_error`` (EI0009): ``Transport init error. Reason: [Create][DestLink]Create Dest
  error! createLink para:rank[1]-localUserrank[1]-..., dst_rank[0]-remoteUserrank[0]-...``
- ``hccl_remote_rank``: any other line with one of those remote/peer rank spellings (plog lines
  printed with ASCEND_SLOG_PRINT_TO_STDOUT=1).
- ``hccl_subgroup_peer`` (weakest): any of the HCCL lines above that names a communicator other than
  the world group (``group:[name]`` / ``communicator: name``, name not ``hccl_world_group`` or
  ``none``): HCCL ranks are ranks *within the communicator*, equal to global ranks only in the
  world group, which is what plain data-parallel jobs use.

HCCL evidence is weak on its own: in a ring every surviving rank reports the neighbour it waited
for, which may itself be waiting; prefer the scheduler's messages and the ranks' exit records.

Not covered: NCCL (MindSpore GPU). NCCL's warnings name peers by address (``NET/Socket : peer
10.0.0.2<43511>``, ``Call to recv from 10.1.1.2<40313> failed``), and MindSpore GPU prints no
watchdog message naming a peer rank, so there is no rank to return. The HCCL link-setup table
(``LINK_ERROR_INFO``, ``dest_ip(user_rank) | src_ip(user_rank) | MyRole``) is also left out: which
of its two ranks is the remote one is not stated on the line.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_TEXT = 500


class Blame(NamedTuple):
    ranks: tuple[int, ...]
    kind: str
    text: str


KIND_STRENGTH = {
    "first_timed_out": 50,
    "timed_out_list": 40,
    "node_timed_out": 30,
    "hccl_notify_timeout": 20,
    "hccl_socket_timeout": 20,
    "hccl_sdma_error": 20,
    "hccl_transport_error": 15,
    "hccl_remote_rank": 10,
    "hccl_subgroup_peer": 5,
}
"""How much each kind of evidence weighs; higher is stronger."""

_ID = r"""['"]?(\d+)['"]?"""
_FIRST = re.compile(r"\bworker\s*:?\s*" + _ID + r"\s+is\s+the\s+first\s+one\s+timed\s+out", re.IGNORECASE)
# The list: after "is" and an optional colon, an optional "[const vector]" tag, then a bracketed
# list, or else bare ids up to the next comma-word (", worker 1 is ...").
_LIST = re.compile(
    r"timed\s+out\s+node\s+list\s+is\s*:?\s*(?:\[const vector\]\s*)?"
    r"(?:[\[{(]([^\]})]*)[\]})]|((?:['\"]?\d+['\"]?[\s,;]*)+))",
    re.IGNORECASE,
)
_NODE = re.compile(r"\bnode\s*:?\s*" + _ID + r"\s+is\s+timed\s+out", re.IGNORECASE)
_SPLIT = re.compile(r"[\s,;]+")

# "remote rank: [24]", "remote rank:[24]", "remote rank [3]", "remote_rank:[3]", "remote rank id: 3",
# "Remote rank: 3.", "remoteUserrank[14]", "Waiting peer rank: 4;".
_PEER = re.compile(
    r"\b(?:remote|peer)[ _]?(?:user)?rank(?:[ _]?id)?\s*[:=]?\s*[\[(]?\s*(\d+)\s*[\])]?",
    re.IGNORECASE,
)
_GROUP = re.compile(r"(?:\bgroup\s*:?\s*\[|\bcommunicator\s*:\s*\[?)\s*([^\],;\s]+)", re.IGNORECASE)
_WORLD = ("hccl_world_group", "none", "unknown", "unspecified")
# The error code, or the message's own words where the code prefix is not on the same line.
_HCCL_KIND = (
    (("EI0002", "Notify register"), "hccl_notify_timeout"),
    (("EI0006", "Getting socket times out"), "hccl_socket_timeout"),
    (("EI0012", "SDMA memory copy"), "hccl_sdma_error"),
    (("EI0009", "ransport init error"), "hccl_transport_error"),
)


def blame(line: str) -> Blame | None:
    """The rank(s) a MindSpore or HCCL log line blames, or None (see the module docstring)."""
    if "imed out" in line:
        found = _scheduler(line)
        if found is not None:
            return found
    if "emote" in line or "peer rank" in line or "Peer rank" in line:
        return _hccl(line)
    return None


def _text(line: str) -> str:
    text = line.strip()
    return text[:MAX_TEXT]


def _scheduler(line: str) -> Blame | None:
    listed: list[int] = []
    m = _LIST.search(line)
    if m is not None:
        body = m.group(1) if m.group(1) is not None else m.group(2)
        # Whole numeric ids only: a non-numeric MS_NODE_ID ("worker-0") is not a rank.
        listed = [
            int(x) for x in (i.strip("'\"") for i in _SPLIT.split(body or "")) if x.isascii() and x.isdigit()
        ]
    first = _FIRST.search(line)
    if first is not None:
        ranks = _unique([int(first.group(1)), *listed])
        # Several nodes in the list: MindSpore's "first" is only the smallest id by string order.
        return Blame(ranks, "first_timed_out" if len(ranks) == 1 else "timed_out_list", _text(line))
    if listed:
        return Blame(_unique(listed), "timed_out_list", _text(line))
    node = _NODE.search(line)
    if node is not None:
        return Blame((int(node.group(1)),), "node_timed_out", _text(line))
    return None


def _hccl(line: str) -> Blame | None:
    ranks = _unique([int(x) for x in _PEER.findall(line)])
    if not ranks:
        return None
    kind = "hccl_remote_rank"
    for markers, name in _HCCL_KIND:
        if markers[0] in line or markers[1] in line:
            kind = name
            break
    group = _GROUP.search(line)
    if group is not None and group.group(1).rstrip(".").lower() not in _WORLD:
        kind = "hccl_subgroup_peer"
    return Blame(ranks, kind, _text(line))


def _unique(values: list[int]) -> tuple[int, ...]:
    seen: list[int] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return tuple(seen)

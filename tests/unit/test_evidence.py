"""agent/evidence.py: the lines in which MindSpore's scheduler or HCCL names the rank that stopped
responding give that rank; everything else, including near misses, gives None."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mscon.agent.evidence import KIND_STRENGTH, MAX_TEXT, Blame, blame

DATA = Path(__file__).parent / "data"
_SCHED = (
    "[ERROR] DISTRIBUTED(3150,7f0c59ffb640,python):2024-05-20-10:13:38.771.904 "
    "[mindspore/ccsrc/distributed/cluster/topology/meta_server_node.cc:571] UpdateTopoState] "
)
# EI0002 as CANN 8.0 prints it (vllm-project/vllm-ascend#3413), in the world group and in a sub-group.
_EI0002 = (
    "EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times out. "
    "Reason: The Notify register has not received the Notify record from remote rank: [24]. "
    "base information: [streamID:[109], taskID[38], taskType[Notify Wait], tag[AllReduce_hccl_world_group], "
    "AlgType(level 0-1-2):[ring-NHR-NHR].]. task information: [notify id:[0x0000000000000213], stage:[0], "
    "remote rank:[24]]. group information: [group:[{group}], user define information[Unspecified], "
    "rankSize[32], rankId[25 24]]"
)


@pytest.mark.parametrize(
    ("line", "ranks", "kind"),
    [
        # MindSpore scheduler (meta_server_node.cc, UpdateTopoState).
        (
            _SCHED + "The node: 1 is timed out. It may exit with exception, please check this node's log.",
            (1,),
            "node_timed_out",
        ),
        (
            "The node: 12 is timed out. It may exit with exception, please check this node's log.",
            (12,),
            "node_timed_out",
        ),
        ("node: 3 is timed out", (3,), "node_timed_out"),
        ('The node: "5" is timed out.', (5,), "node_timed_out"),
        (
            "RuntimeError: The total number of timed out node is 1. "
            "Timed out node list is: [const vector][2], worker 2 is the first one timed out, "
            "please check its log.",
            (2,),
            "first_timed_out",
        ),
        (
            "[EXCEPTION] DISTRIBUTED(3150,7f0c59ffb640,python):2024-05-20-10:13:38.772.004 "
            "[meta_server_node.cc:577] UpdateTopoState] The total number of timed out node is 1. "
            "Timed out node list is: [const vector][7], worker 7 is the first one timed out, "
            "please check its log.",
            (7,),
            "first_timed_out",
        ),
        ("worker 4 is the first one timed out, please check its log.", (4,), "first_timed_out"),
        # Several nodes: MindSpore's "first" is string order, not time order (see the module docstring).
        (
            "RuntimeError: The total number of timed out node is 2. "
            "Timed out node list is: [const vector][1, 3], worker 1 is the first one timed out, "
            "please check its log.",
            (1, 3),
            "timed_out_list",
        ),
        (
            "Timed out node list is: [const vector][10, 2], worker 10 is the first one timed out",
            (10, 2),
            "timed_out_list",
        ),
        ("Timed out node list is: [1, 3]", (1, 3), "timed_out_list"),
        ("Timed out node list is : ['3', '1']", (3, 1), "timed_out_list"),
        ('Timed out node list is: ["0" "6"]', (0, 6), "timed_out_list"),
        ("Timed out node list is: {4, 5}", (4, 5), "timed_out_list"),
        ("Timed out node list is: 2, 5, worker 5 is the first one timed out", (5, 2), "timed_out_list"),
        ("timed out node list is:[const vector][worker-0, 3]", (3,), "timed_out_list"),
        # HCCL EI0002 (notify wait timeout), three CANN generations.
        (_EI0002.format(group="hccl_world_group"), (24,), "hccl_notify_timeout"),
        (
            "[rank1]: EI0002: The wait execution of the Notify register times out. Reason: The "
            "Notify register "
            "has not received the Notify record from remote rank [3]. base information: [streamID:[2], "
            "taskID[11], tag[AllReduce_hccl_world_group]] task information: []",
            (3,),
            "hccl_notify_timeout",
        ),
        (
            "EI0002: [PID: 811] 2025-11-02-09:14:01.100.220 A timeout occurs when the Notify "
            "register waits for "
            "execution. Waiting peer rank: 4; task information: streamID:[90], taskID[686], "
            "taskType[Notify Wait]"
            ", AlgType(level 0-1-2):[ring-ring-NHR].; communication operator information: notify id:"
            "[0x00000000000018fc], stage:[0], remote rank:[4]; communicator: none.",
            (4,),
            "hccl_notify_timeout",
        ),
        (
            "A timeout occurs when the Notify register waits for execution. Waiting peer rank: 6; task "
            "information: streamID:[3]; communication operator information: remote rank:[6]; "
            "communicator: none.",
            (6,),
            "hccl_notify_timeout",
        ),
        # HCCL EI0006 with a rank id, in the spellings the agent may meet.
        (
            "[ERROR] HCCL(51721,python):2025-03-01-11:02:03.004.005 [hccl_socket_manager.cc:778] EI0006: "
            "Getting socket times out. Reason: Remote Rank did not send the data in time. remote rank id: 3",
            (3,),
            "hccl_socket_timeout",
        ),
        (
            "EI0006: Getting socket times out. Reason: link setup timed out, remote_rank:[3]",
            (3,),
            "hccl_socket_timeout",
        ),
        ("EI0006: Getting socket times out. remote rank [5] did not answer", (5,), "hccl_socket_timeout"),
        # EI0012, EI0009, and other HCCL lines naming the peer.
        (
            "EI0012: SDMA memory copy task exception occurred. Remote rank: 2. Base information: "
            "[streamID:[4]]. "
            "Task information: []. Communicator information: [group:[hccl_world_group]].",
            (2,),
            "hccl_sdma_error",
        ),
        (
            "[rank1]: EI0009: [PID: 2225827] 2025-09-24-20:59:48.119.066 Transport init error. "
            "Reason: [Create]"
            "[DestLink]Create Dest error! createLink "
            "para:rank[1]-localUserrank[1]-localIpAddr[172.16.0.114], "
            "dst_rank[0]-remoteUserrank[0]-remote_ip_addr[172.16.0.114]",
            (0,),
            "hccl_transport_error",
        ),
        (
            "[ERROR] HCCL(3822,python):2025-01-07-16:20:11.004.771 [task_exception_handler.cc:822] "
            "[TaskExceptionHandler][Callback] Task run failed, base information is streamID:[5], "
            "remote rank:[7]",
            (7,),
            "hccl_remote_rank",
        ),
        # A sub-communicator's ranks are not global ranks: weakest kind.
        (_EI0002.format(group="group_name_1654"), (24,), "hccl_subgroup_peer"),
        (
            "EI0012: SDMA memory copy task exception occurred. Remote rank: 1. Communicator information: "
            "[group:[tp-0-1-2-3], rankSize[4]].",
            (1,),
            "hccl_subgroup_peer",
        ),
    ],
)
def test_blame_names_the_rank(line: str, ranks: tuple[int, ...], kind: str) -> None:
    got = blame(line)
    assert got == Blame(ranks, kind, line.strip()[:MAX_TEXT])
    assert kind in KIND_STRENGTH


@pytest.mark.parametrize(
    "line",
    [
        # MindSpore lines about nodes that blame nobody.
        _SCHED + "The node: 1 have been recovered. IP address: 10.0.0.1, rank id: 1",
        "[WARNING] DISTRIBUTED(3150,7f0c,python):2024-05-20 ProcessRegister] The new node: 0(role: "
        "MS_WORKER), "
        "rank id: 0, device id: 0, hostname: node-a, ip: 10.0.0.1 is registered successfully.",
        "[ERROR] DISTRIBUTED(3150,7f0c,python):2024-05-20 Finalize] There are 2 abnormal compute "
        "graph nodes.",
        "The total number of timed out node is 2.",
        "RuntimeError: The state of the cluster is error, total nodes num: 4, abnormal nodes num: 1",
        "Failed to connect to the meta server. Maybe it has exited. Please check scheduler's log.",
        "Timed out node list is: [const vector][worker-a, worker-b]",
        "worker abc is the first one timed out",
        # HCCL lines that name no rank.
        "EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: Remote "
        "Rank did "
        "not send the data in time. Please check the reason for the rank being stuck",
        "EI0002: The wait execution of the Notify register times out. Reason: The Notify register has not "
        "received the Notify record from remote rank: [unknown]. base information: [streamID:[1]]",
        "EI0005: The parameters of operator HcclAllReduce are inconsistent between ranks, parameter "
        "count is 8 "
        "on the local rank and 16 on the remote rank.",
        "[ERROR] 2025-04-08-18:07:20 (PID:1292363, Device:1, RankID:1) ERR01100 OPS call acl api failed.",
        # Ordinary training output.
        "epoch: 1 step: 20, loss is 0.6931",
        "Timed out waiting for the dataset after 60s",
        "remote: Counting objects: 100% (12/12), done.",
        "",
    ],
)
def test_lines_that_name_no_rank_are_not_blame(line: str) -> None:
    assert blame(line) is None


def test_the_recorded_scheduler_log() -> None:
    found = [b for b in map(blame, (DATA / "scheduler.log").read_text().splitlines()) if b is not None]
    assert [(b.ranks, b.kind) for b in found] == [
        ((1,), "node_timed_out"),
        ((3,), "node_timed_out"),
        ((1, 3), "timed_out_list"),
    ]


def test_text_is_the_stripped_line_cut_short() -> None:
    got = blame("  The node: 2 is timed out. " + "x" * 2000 + "  \n")
    assert got is not None and got.text.startswith("The node: 2 is timed out.") and len(got.text) == MAX_TEXT


def test_kinds_are_ranked() -> None:
    s = KIND_STRENGTH
    assert s["first_timed_out"] > s["timed_out_list"] > s["node_timed_out"] > s["hccl_notify_timeout"]
    assert s["hccl_notify_timeout"] > s["hccl_remote_rank"] > s["hccl_subgroup_peer"]


def test_blame_is_cheap_on_ordinary_lines() -> None:
    text = "\n".join(
        (DATA / n).read_text() for n in ("mindspore_rank0.log", "mindformers_rank0.log", "scheduler.log")
    )
    others = [line for line in text.splitlines() if blame(line) is None]
    lines = others * (200_000 // len(others) + 1)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for line in lines:
            blame(line)
        best = max(best, len(lines) / (time.perf_counter() - t0))
    print(f"blame: {best:,.0f} ordinary lines/s")
    assert best >= 50_000

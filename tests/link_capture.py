"""What crosses mscon's TCP links, seen from outside: a loopback capture (Debian's tcpdump) read
back into the bytes of each TCP flow, and a flood of connections that never authenticate."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

Flow = tuple[str, int, str, int]  # source address, port, destination address, port


def tcpdump_unavailable_reason() -> str:
    if shutil.which("tcpdump") is None:
        return "tcpdump is not installed (apt-get install tcpdump)"
    if os.geteuid() != 0:
        return "capturing on the loopback needs root"
    return ""


_SENTINEL = ("127.0.33.254", 9)  # a UDP datagram here marks a point in the capture


class Capture:
    """``tcpdump -i lo`` with a BPF filter, writing a pcap file. A datagram of our own marks when
    it is live and, at the end, that every packet before it was written (the kernel hands packets
    over in order): no sleep decides either."""

    def __init__(self, path: Path, bpf: str) -> None:
        self.path = path
        host, port = _SENTINEL
        self.partial: set[Flow] = set()  # flows whose first bytes the capture missed (stop())
        self.proc = subprocess.Popen(
            # -B: a 32 MiB kernel buffer (2 MiB by default), so a tcpdump starved of CPU (a flood on a
            # loaded machine) drops no packet as long as it can
            ["tcpdump", "-i", "lo", "--immediate-mode", "-U", "-B", "32768", "-s", "0", "-n", "-w", str(path)]
            + [f"({bpf}) or (udp and dst host {host} and dst port {port})"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._mark("started")

    def _mark(self, what: str, timeout: float = 30) -> None:
        """Send marks until one is in the file."""
        mark = f"mscon-capture-{what}-{secrets.token_hex(8)}".encode()
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            while True:
                udp.sendto(mark, _SENTINEL)
                for _ in range(50):  # the file polled for the mark, 10 ms apart
                    if self.path.exists() and mark in self.path.read_bytes():
                        return
                    assert self.proc.poll() is None, f"tcpdump ended: {self.proc.stderr.read()!r}"
                    time.sleep(0.01)
                assert time.monotonic() < deadline, f"tcpdump never wrote its {what} mark"

    def stop(self) -> dict[Flow, bytes]:
        """End the capture (every packet before the last mark written) and read it back. The flows
        whose start it missed (the kernel dropped packets for a starved tcpdump) are in ``partial``:
        their bytes begin mid-stream, so what a flow begins with is asked only of the others."""
        if self.proc.poll() is None:
            self._mark("stopping")
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        flows, self.partial = read_flows(self.path)
        return flows

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def read_flows(path: Path) -> tuple[dict[Flow, bytes], set[Flow]]:
    """Each TCP flow's payload in capture order (IPv4 over Ethernet, as ``-i lo`` writes it), and
    the flows whose first payload is not the byte after their SYN's sequence number (no SYN
    captured, or the first segments dropped)."""
    data = path.read_bytes()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    assert linktype == 1, f"link type {linktype}: expected Ethernet (tcpdump -i lo)"
    flows: dict[Flow, bytearray] = defaultdict(bytearray)
    isn: dict[Flow, int] = {}
    partial: set[Flow] = set()
    at = 24
    while at + 16 <= len(data):
        _, _, caplen, _ = struct.unpack(endian + "IIII", data[at : at + 16])
        frame = data[at + 16 : at + 16 + caplen]
        at += 16 + caplen
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        offset = (tcp[12] >> 4) * 4
        src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        flow = (src, sport, dst, dport)
        if tcp[13] & 0x02:  # SYN (or SYN-ACK): the sequence number the flow's payload follows
            isn[flow] = seq
        payload = tcp[offset:]
        if payload and flow not in flows and (flow not in isn or seq != (isn[flow] + 1) % 2**32):
            partial.add(flow)
        if payload:
            flows[flow] += payload
    return {k: bytes(v) for k, v in flows.items()}, partial


def on_port(flows: dict[Flow, bytes], port: int) -> dict[Flow, bytes]:
    return {k: v for k, v in flows.items() if port in (k[1], k[3])}


def leaks(flows: dict[Flow, bytes], needles: list[bytes]) -> list[str]:
    """Which of ``needles`` appear in which flow (none: nothing readable crossed)."""
    return [f"{n!r} in {k}" for k, v in flows.items() for n in needles if n in v]


@dataclass
class FloodResult:
    opened: int = 0
    refused: int = 0  # connections the kernel or the listener refused outright
    closed_by_peer: int = 0  # of those kept open: closed by the listener (deadline, cap, junk)


def flood(host: str, port: int, total: int = 2000, batch: int = 200, keep_s: float = 0.3) -> FloodResult:
    """``total`` connections that never authenticate, in batches: a quarter only connect and close
    at once, a quarter send junk (not TLS), a quarter a TLS record header that never completes,
    a quarter say nothing; each batch is kept open ``keep_s`` (the attack's pace), then closed."""
    result = FloodResult()
    junk = [b"", b"GET / HTTP/1.0\r\n\r\n" + os.urandom(64), b"\x16\x03\x01\x40\x00" + b"\0" * 32, None]
    sent = 0
    while sent < total:
        held: list[socket.socket] = []
        for i in range(min(batch, total - sent)):
            sent += 1
            try:
                sock = socket.create_connection((host, port), timeout=5)
            except OSError:
                result.refused += 1
                continue
            result.opened += 1
            what = junk[i % 4]
            if what == b"":
                sock.close()  # connect, then gone
                continue
            if what is not None:
                with contextlib.suppress(OSError):
                    sock.sendall(what)
            held.append(sock)
        time.sleep(keep_s)  # the attack's pace, not a synchronisation
        for sock in held:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                try:
                    if sock.recv(65536) == b"":
                        result.closed_by_peer += 1
                except (ConnectionResetError, BrokenPipeError):
                    result.closed_by_peer += 1
            sock.close()
    return result

"""Console CPU per small SSH packet: asyncssh's default cipher order against mscon's.

The console reads every node's messages through one process; most are small (a MetricBatch or a
TelemetryBatch of one node, a check result), so the cost per packet, not per byte, sets how many
nodes one console core can follow. asyncssh puts ChaCha20-Poly1305 first and builds two cipher
objects per packet in Python; mscon puts AES-GCM first (``console/transport/ssh.py``), one call on
AES-NI, where the ssh config chose no ``Ciphers``. This runs ROUNDS JSON-line round trips through
``cat`` on one real sshd node (127.0.0.2) with each order and prints the console's CPU per packet
(user + system: loopback's kernel work is counted with the sender).

    .venv/bin/python bench/ssh_packets.py [--rounds 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import asyncssh
from mscon.console.transport.ssh import PREFERRED_CIPHERS
from procstat import sshd_nodes  # bench/ is on sys.path when run as a script

ORDERS = {
    "asyncssh default (chacha20-poly1305 first)": None,
    "mscon (aes128-gcm first)": list(PREFERRED_CIPHERS),
}


async def cpu_per_packet(
    node: object, cluster: object, algs: list[str] | None, rounds: int
) -> tuple[float, str]:
    kw = {"encryption_algs": algs} if algs else {}
    async with asyncssh.connect(
        node.host,  # type: ignore[attr-defined]
        port=node.port,  # type: ignore[attr-defined]
        username="root",
        client_keys=[str(cluster.client_key)],  # type: ignore[attr-defined]
        known_hosts=str(cluster.known_hosts),  # type: ignore[attr-defined]
        config=[],
        **kw,
    ) as conn:
        proc = await conn.create_process("cat", encoding=None)
        t0 = time.process_time()
        for i in range(rounds):
            proc.stdin.write(b'{"type":"telemetry_batch","node":"node1","n":%d}\n' % i)
            await proc.stdout.readline()
        spent = time.process_time() - t0
        return spent / (2 * rounds), str(conn.get_extra_info("send_cipher"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sshd = sshd_nodes()
    with tempfile.TemporaryDirectory(prefix="mscon-bench-ssh-") as tmp:
        cluster = sshd.start_sshd_cluster(Path(tmp) / "sshd", n=1)
        try:
            got: dict[str, list[float]] = {name: [] for name in ORDERS}
            cipher: dict[str, str] = {}
            for _ in range(a.repeat):  # interleaved, so a busy moment hits both
                for name, algs in ORDERS.items():
                    per, cipher[name] = asyncio.run(cpu_per_packet(cluster.nodes[0], cluster, algs, a.rounds))
                    got[name].append(per * 1e6)
        finally:
            cluster.stop()
    print(f"console CPU per packet, {a.rounds} round trips x {a.repeat}; median (min-max) microseconds")
    base = statistics.median(got[next(iter(ORDERS))])
    for name, values in got.items():
        med = statistics.median(values)
        print(
            f"{name:<44} {cipher[name]:<30} {med:6.0f} ({min(values):.0f}-{max(values):.0f})"
            f"  {med / base:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

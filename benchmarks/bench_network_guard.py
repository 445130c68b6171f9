"""The network guard's audit hook when no replay is active: a loopback connect with and without it.

The guard's floor is an audit hook (``sys.addaudithook``), which cannot be removed once added, so
a process that has ever replayed pays for it on every audit event for the rest of its life. With
no guard active the hook reads one global and returns. What it costs is measured where it is most
visible, a TCP connect to a listener on 127.0.0.1 (a fresh socket, ``connect``, ``close``: the
socket raises two audit events, ``socket.__new__`` and ``socket.connect``).

The hook cannot be taken out of a process, so each side runs in fresh child processes, one
"bare" and one where a guard was activated and deactivated first (the hook installed, idle),
in interleaved rounds; the ratio is the median of the per-round ratios.

``python -m benchmarks.bench_network_guard [--quick]`` prints the markdown section.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time

from benchmarks._common import fmt_us, interleave, paired_ratio, run_module, table

_MODULE = "benchmarks.bench_network_guard"
_RESET = struct.pack("ii", 1, 0)  # close with a reset: thousands of connects exhaust no ports


def _child(side: str, connects: int) -> dict[str, float]:
    """Seconds per loopback connect in this process, the hook installed or not."""
    if side == "hook":
        from stepfork_otel.replay.network import NetworkGuard

        guard = NetworkGuard()
        guard.deactivate(guard.activate())  # the hook stays, switched off
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    address = server.getsockname()

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    batches = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(connects):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)  # no TIME_WAIT
            sock.connect(address)
            sock.close()
        batches.append((time.perf_counter() - start) / connects)
    server.close()
    return {side: statistics.median(batches[2:])}  # the first two warm up


def _measure(side: str, connects: int) -> float:
    return float(run_module(_MODULE, "--child", side, str(connects))[side])


def run(quick: bool = False) -> str:
    connects, rounds = (100, 3) if quick else (500, 7)
    series = interleave(
        [
            ("bare", lambda: _measure("bare", connects)),
            ("hook", lambda: _measure("hook", connects)),
        ],
        rounds,
        warmup=0 if quick else 1,
    )
    ratio = paired_ratio(series, "hook", "bare")
    rows = [
        ["no audit hook", fmt_us(series["bare"].median), "1.00x"],
        [
            "the guard's hook installed, no guard active",
            fmt_us(series["hook"].median),
            f"**{ratio:.2f}x**",
        ],
    ]
    return "\n".join(
        [
            "## Network guard: the idle audit hook",
            "",
            f"A loopback TCP connect (new socket, connect, close), {connects} per batch, median of "
            f"5 batches per child process, {rounds} interleaved rounds of fresh processes.",
            "",
            table(["connect to 127.0.0.1", "median per connect", "vs. no hook"], rows),
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "CONNECTS"))
    args = parser.parse_args()
    if args.child:
        side, connects = args.child
        print(json.dumps(_child(side, int(connects))))
        return
    print(run(quick=args.quick))


if __name__ == "__main__":
    sys.exit(main())

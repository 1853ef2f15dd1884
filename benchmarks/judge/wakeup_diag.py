"""How long a process asleep on a pipe takes to wake, on this machine: the judge's clock counts it.

A parent sends one byte; the child does `work_ms` of busy work and answers one byte; the parent's clock runs from
send to answer. Before each exchange the parent idles `gap_ms` (as while the judge stages inputs). Each side
either blocks in poll/recv (a sleeping thread) or spins on a zero-timeout poll. The excess over `work_ms` is
the protocol's cost in each mode.
Usage: python benchmarks/judge/wakeup_diag.py [OUT.json]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.connection import Connection


def spin_until(conn: Connection, spin: bool) -> None:
    if spin:
        while not conn.poll(0):
            pass


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def child(conn: Connection, spin: bool, work_ms: float) -> None:
    while True:
        spin_until(conn, spin)
        msg = conn.recv_bytes()
        if msg == b"Q":
            return
        busy(work_ms)
        conn.send_bytes(b"D")


def exchange(parent_spin: bool, child_spin: bool, work_ms: float, gap_ms: float, n: int = 40) -> float:
    a, b = mp.Pipe()
    p = mp.Process(target=child, args=(b, child_spin, work_ms))
    p.start()
    excess = []
    for _ in range(n):
        time.sleep(gap_ms / 1e3)
        t0 = time.perf_counter()
        a.send_bytes(b"G")
        spin_until(a, parent_spin)
        a.recv_bytes()
        excess.append((time.perf_counter() - t0) * 1e3 - work_ms)
    a.send_bytes(b"Q")
    p.join()
    return statistics.median(excess[5:])


def main() -> None:
    res = {}
    for work_ms in (0.0, 3.0):
        for gap_ms in (0.0, 30.0):
            for parent_spin in (False, True):
                for child_spin in (False, True):
                    key = f"work{work_ms:g}_gap{gap_ms:g}_parent{'spin' if parent_spin else 'block'}" \
                          f"_child{'spin' if child_spin else 'block'}"
                    res[key] = round(exchange(parent_spin, child_spin, work_ms, gap_ms), 4)
                    print(key, res[key], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

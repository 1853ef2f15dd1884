"""Where a timed call's staging goes on a GPU host: the judge's and the worker's pieces of `judge/staging.py`, each
timed alone in this process (no sandbox, no pipe), for N input sets of a problem's inputs (problems/gemm 01: one
32 MB tensor). Prints JSON: milliseconds per set for each piece.
Usage: python benchmarks/judge/staging_diag.py [REF.py] [N]"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from kfuse.judge import staging
from kfuse.load import load_problem
from kfuse.verify import seeded_inputs


def per_set(seconds: float, n: int) -> float:
    return round(seconds * 1e3 / n, 3)


def main() -> None:
    ref = sys.argv[1] if len(sys.argv) > 1 else "problems/gemm/01_gemm_gelu.py"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    problem = load_problem(ref)
    folder = Path(tempfile.mkdtemp(prefix="staging-diag-", dir=staging_folder()))
    out: dict[str, object] = {"ref": ref, "sets": n, "gpu": torch.cuda.get_device_name(), "folder": str(folder)}
    torch.cuda.synchronize()

    t0 = time.perf_counter()
    draws = [seeded_inputs(problem, i, device="cuda") for i in range(n)]
    torch.cuda.synchronize()
    out["draw_ms"] = per_set(time.perf_counter() - t0, n)
    out["set_bytes"] = sum(t.nbytes for t in draws[0] if isinstance(t, torch.Tensor))

    t0 = time.perf_counter()
    for xs in draws:
        for t in xs:
            if isinstance(t, torch.Tensor):
                staging._on_host(t)
    out["device_to_pinned_ms"] = per_set(time.perf_counter() - t0, n)

    for label in ("write_sets_ms", "write_sets_again_ms"):  # a fresh file each time, as the judge writes
        path = folder / f"{label}.bin"
        t0 = time.perf_counter()
        manifest = staging.write_sets(path, iter(draws))
        out[label] = per_set(time.perf_counter() - t0, n)
        if label == "write_sets_ms":
            kept = path
        else:
            path.unlink()

    m = manifest.to_json()
    out["judge_registered_write_ms"] = per_set(registered_write(folder / "direct.bin", draws, manifest), n)
    out["fallocate_ms"], out["pwrite_over_allocated_ms"] = over_allocated(folder / "over.bin", draws, manifest)

    def cast(xs: list) -> list:
        return [x.to("cuda") if isinstance(x, torch.Tensor) else x for x in xs]

    for label in ("registered_ms", "registered_again_ms"):
        t0 = time.perf_counter()
        sets, via = staging.device_sets(str(kept), m, "cuda", cast)
        torch.cuda.synchronize()
        out[label] = per_set(time.perf_counter() - t0, n)
        out["via"] = via
        del sets
    t0 = time.perf_counter()
    sets = [cast(xs) for xs in staging.read_sets(str(kept), m)]
    torch.cuda.synchronize()
    out["copy_on_write_ms"] = per_set(time.perf_counter() - t0, n)
    del sets
    kept.unlink()
    os.rmdir(folder)
    print(json.dumps(out, indent=1))


def registered_write(path: Path, draws: list, manifest: staging.Manifest) -> float:
    """A judge-side variant (not in staging.py): the file sized first, mapped shared, page-locked in place, and
    each draw copied into it from the device by DMA (no pinned bounce buffer, no pwrite). Seconds for all sets."""
    import mmap
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, manifest.size)
    mm = mmap.mmap(fd, manifest.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    buf = torch.frombuffer(mm, dtype=torch.uint8)
    cudart = torch.cuda.cudart()
    ok = cudart.cudaHostRegister(buf.data_ptr(), manifest.size, 0) == cudart.cudaError.success
    for xs, items in zip(draws, manifest.sets):
        for t, item in zip(xs, items):
            if isinstance(item, staging.Slot) and t.nbytes:
                buf[item.offset:item.offset + t.nbytes].view(t.dtype).view(t.shape).copy_(t)
    torch.cuda.synchronize()
    if ok:
        cudart.cudaHostUnregister(buf.data_ptr())
    seconds = time.perf_counter() - t0
    del buf
    mm.close()
    path.unlink()
    return seconds if ok else float("nan")


def over_allocated(path: Path, draws: list, manifest: staging.Manifest) -> tuple[float, float]:
    """A judge-side variant: the file's pages allocated first (posix_fallocate, off the clock in a judge that
    does it ahead), then each set written with pwrite over them. Milliseconds per set for each step."""
    n = len(draws)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    t0 = time.perf_counter()
    os.posix_fallocate(fd, 0, manifest.size)
    alloc = per_set(time.perf_counter() - t0, n)
    t0 = time.perf_counter()
    for xs, items in zip(draws, manifest.sets):
        for t, item in zip(xs, items):
            if isinstance(item, staging.Slot) and t.nbytes:
                host = staging._on_host(t)
                view = memoryview(host.reshape(-1).view(torch.uint8).numpy()).cast("B")
                done = 0
                while done < t.nbytes:
                    done += os.pwrite(fd, view[done:], item.offset + done)
    over = per_set(time.perf_counter() - t0, n)
    os.close(fd)
    path.unlink()
    return alloc, over


def staging_folder() -> str | None:
    from kfuse.judge.ipc import memory_folder
    return memory_folder()


if __name__ == "__main__":
    main()

"""A judge-side stage file allocated ahead of a candidate's timing, and written over for each batch of timed calls.

Writing a batch's input sets into a fresh /dev/shm file cost ~13-17 ms per 32 MB set on an H100 host
(benchmarks/judge/NOTES.md): most of it allocating the file's pages and copying into them through the page cache.
An `Area` allocates its file's pages (posix_fallocate) and, on the GPU, maps them shared and page-locks them
(cudaHostRegister) in a background thread while the candidate's correctness is checked; each batch is then
written by DMA straight from the judge's device draws into the locked pages (elsewhere, by pwrite over pages
already there). The file is linked into a worker's request folder for its stage request only (the worker maps
it read-only, as it maps a fresh file: staging.device_sets) and unlinked when the worker has answered.

One area serves one evaluation: the candidate and its baselines are timed on the same draws, one after another,
so no worker can read through it anything it was not given itself. It is freed when the evaluation ends. Where
the memory is short, the folder is on another filesystem, or anything fails, the judge writes fresh files as
before (staging.write_sets).
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from kfuse.judge import staging
from kfuse.judge.ipc import SHM_FREE_BYTES, memory_folder

MIN_BYTES = 64 << 20  # smaller batches cost little to write fresh: no area


class Area:
    """A file of `size` bytes in `folder`, allocated (and on the GPU registered) by a background thread.

    The thread holds `hold()` while it works (the judge passes clock.GATE.shared: pinning gigabytes costs CPU
    time and driver work, never while another candidate is timed at --jobs > 1); the evaluation joins it
    (`ready()`) before it takes the device for its own timing."""

    def __init__(self, folder: Path, size: int, gpu: bool,
                 hold: Callable[[], AbstractContextManager[object]] = nullcontext) -> None:
        self.folder = folder  # the area's own, removed with it
        self.path = folder / "stage-area.bin"
        self.size = size
        self.registered = False
        self.error: str | None = None
        self.refused: str | None = None
        self._fd: int | None = None
        self._mm: mmap.mmap | None = None
        self._buf: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._open, args=(gpu, hold), name="kfuse-stage-area", daemon=True)
        self._thread.start()

    def _open(self, gpu: bool, hold: Callable[[], AbstractContextManager[object]]) -> None:
        try:
            with hold():
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._fd = fd
                os.posix_fallocate(fd, 0, self.size)
                if gpu:
                    self._register(fd)
        except (OSError, RuntimeError, ValueError) as err:
            self.error = f"{type(err).__name__}: {err}"
            self._release()

    def _register(self, fd: int) -> None:
        """The pages mapped shared and page-locked: device tensors then land in them by DMA. A refusal leaves
        the area unregistered (pwrite over its pages; `refused` says why); CUDA's last error is per thread, this
        one's. Linux refuses to pin writable file pages for long outside tmpfs (they need dirty tracking): on
        a disk-backed folder the area is never registered, in /dev/shm it is."""
        mm = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        buf = torch.frombuffer(mm, dtype=torch.uint8)
        cudart = torch.cuda.cudart()
        code = cudart.cudaHostRegister(buf.data_ptr(), self.size, 0)
        if code == cudart.cudaError.success:
            self._mm, self._buf, self.registered = mm, buf, True
            return
        self.refused = f"cudaHostRegister: {code}"
        del buf
        mm.close()

    def how(self) -> str:
        """How batches reach the area, for the record: 'registered' (DMA), 'allocated' (pwrite) or 'failed'."""
        if not self.ready():
            return "failed"
        return "registered" if self.registered else "allocated"

    def ready(self) -> bool:
        """Whether the area can take a batch (waits for the background thread)."""
        self._thread.join()
        return self.error is None and self._fd is not None

    def write(self, sets: Iterable[Sequence[Any]]) -> staging.Manifest:
        """The sets written from offset 0 over what the last batch left (staging.lay_out's layout); a batch
        larger than the area raises staging.TooLarge, and the caller writes a fresh file instead."""
        if self.registered and self._buf is not None:
            buf = self._buf

            def put(t: torch.Tensor, offset: int) -> None:
                buf[offset:offset + t.nbytes].view(t.dtype).view(t.shape).copy_(t.detach())  # DMA from the device
            manifest = staging.lay_out(sets, put, self.size)
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()  # every copy landed before the worker reads the file
            return manifest
        assert self._fd is not None
        fd = self._fd
        return staging.lay_out(sets, lambda t, offset: staging.pwrite_tensor(fd, t, offset), self.size)

    def link(self, dest: Path) -> None:
        os.link(self.path, dest)

    def close(self) -> None:
        self._thread.join()
        self._release()

    def _release(self) -> None:
        if self.registered and self._buf is not None:
            torch.cuda.cudart().cudaHostUnregister(self._buf.data_ptr())
            self.registered = False
        self._buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view still exported: the mapping goes with its last reference
                pass
            self._mm = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.path.unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "Area":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def area_bytes(inputs: Sequence[Any], sets: int) -> int:
    """The bytes of `sets` input sets shaped like `inputs`, as staging.lay_out places them."""
    return sets * sum(staging.aligned(t.nbytes) for t in inputs if isinstance(t, torch.Tensor))


def open_area(size: int, gpu: bool,
              hold: Callable[[], AbstractContextManager[object]] = nullcontext) -> Area | None:
    """An area for batches of `size` bytes, in a folder of its own beside the workers' request folders (the
    same filesystem: it is linked into them), or None where one is not worth it or that filesystem lacks the
    room (it keeps ipc.SHM_FREE_BYTES free besides)."""
    if size < MIN_BYTES:
        return None
    parent = memory_folder() or tempfile.gettempdir()
    try:
        st = os.statvfs(parent)
        if st.f_bavail * st.f_frsize < size + SHM_FREE_BYTES:
            return None
        folder = Path(tempfile.mkdtemp(prefix="kfuse-stage-", dir=parent))
    except OSError:
        return None
    return Area(folder, size, gpu, hold)

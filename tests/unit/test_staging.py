"""Timed calls' input sets as raw bytes in one file (kfuse/judge/staging.py): what the worker maps is exactly what
the judge drew, whatever the dtypes, shapes and plain values, and the worker's writes never reach the file."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
import torch

from kfuse.judge import stage_area, staging
from kfuse.judge.clock import Gate
from kfuse.judge.ipc import WorkerHandle, memory_folder
from kfuse_testing import requires_cuda


def draws() -> list[list]:
    gen = torch.Generator().manual_seed(3)
    return [[torch.randn(37, 70, generator=gen), 5, torch.randint(0, 9, (13,), generator=gen),
             torch.rand(3, generator=gen) > 0.5, torch.tensor(2.5, dtype=torch.float64), torch.empty(0, 129),
             torch.randn(129, generator=gen).to(torch.bfloat16), 0.25, torch.randn(4, 6, generator=gen).t()]
            for _ in range(3)]


def test_sets_come_back_bit_for_bit(tmp_path):
    sets = draws()
    path = tmp_path / "stage.bin"
    manifest = staging.write_sets(path, iter(sets))
    got = staging.read_sets(str(path), manifest.to_json())
    assert len(got) == len(sets)
    for want_set, got_set in zip(sets, got):
        assert len(want_set) == len(got_set)
        for want, have in zip(want_set, got_set):
            if isinstance(want, torch.Tensor):
                assert have.dtype == want.dtype and have.shape == want.shape and torch.equal(have, want)
                assert have.is_contiguous()
            else:
                assert have == want
    slots = [i for s in manifest.sets for i in s if isinstance(i, staging.Slot)]
    assert all(s.offset % staging.ALIGN == 0 for s in slots)
    assert len({s.offset for s in slots if s.shape != (0, 129)}) == len(slots) - 3  # no two tensors share bytes


def test_the_workers_writes_stay_in_its_copy(tmp_path):
    sets = draws()[:1]
    path = tmp_path / "stage.bin"
    manifest = staging.write_sets(path, iter(sets)).to_json()
    first = staging.read_sets(str(path), manifest)[0][0]
    first.add_(1.0)  # a candidate writing into its inputs
    again = staging.read_sets(str(path), manifest)[0][0]
    assert torch.equal(again, sets[0][0]) and not torch.equal(first, again)


def test_the_cpu_worker_takes_the_copy_on_write_path(tmp_path):
    sets = draws()[:2]
    path = tmp_path / "stage.bin"
    manifest = staging.write_sets(path, iter(sets)).to_json()
    got, via = staging.device_sets(str(path), manifest, "cpu", list)
    assert via == "copied" and torch.equal(got[1][0], sets[1][0])


@pytest.mark.gpu
@requires_cuda
def test_the_gpu_worker_copies_from_the_registered_file(tmp_path):
    """On the GPU the file's pages are page-locked in place and copied by DMA: every tensor arrives bit for bit,
    the file's pages are released after (registering the same file again works), and CUDA works on."""
    sets = draws()
    path = tmp_path / "stage.bin"
    manifest = staging.write_sets(path, iter(sets)).to_json()

    def cast(xs):
        return [x.to("cuda") if isinstance(x, torch.Tensor) else x for x in xs]

    for _ in range(2):
        got, via = staging.device_sets(str(path), manifest, "cuda", cast)
        assert via == "registered"
        for want_set, got_set in zip(sets, got):
            for want, have in zip(want_set, got_set):
                if isinstance(want, torch.Tensor):
                    assert have.is_cuda and have.dtype == want.dtype and torch.equal(have.cpu(), want.contiguous())
                else:
                    assert have == want
    assert torch.ones(3, device="cuda").sum().item() == 3.0


def test_an_area_is_written_over_for_each_batch_and_read_through_a_link(tmp_path):
    """The judge's stage area (stage_area.py; on the CPU: pages allocated ahead, pwrite over them): each batch
    written from offset 0 over the last, read back bit for bit through a link in a request folder; a batch
    larger than the area is refused (the judge then writes a fresh file)."""
    sets = draws()
    one = stage_area.area_bytes(sets[0], 1)
    area = stage_area.Area(tmp_path, 2 * one, gpu=False)
    with area:
        assert area.ready() and not area.registered and area.path.stat().st_size == 2 * one
        for batch in (sets[:2], sets[1:]):
            manifest = area.write(iter(batch)).to_json()
            link = tmp_path / "stage7.bin"
            area.link(link)
            got = staging.read_sets(str(link), manifest)
            link.unlink()
            for want_set, got_set in zip(batch, got):
                for want, have in zip(want_set, got_set):
                    assert torch.equal(have, want) if isinstance(want, torch.Tensor) else have == want
        with pytest.raises(staging.TooLarge):
            area.write(iter(sets))
    assert not area.path.exists() and not tmp_path.exists()  # the area's folder goes with it


def test_an_area_is_prepared_only_while_nothing_is_timed(tmp_path):
    """Allocating and pinning an area costs CPU time and driver work: its thread waits while another
    evaluation holds the device for timing (the gate's exclusive side), and prepares it once that ends."""
    gate = Gate()
    with gate.exclusive():
        area = stage_area.Area(tmp_path, stage_area.MIN_BYTES, gpu=False, hold=gate.shared)
        time.sleep(0.3)
        assert not area.path.exists()  # not even created while the other timer runs
    with area:
        assert area.ready() and area.path.stat().st_size == stage_area.MIN_BYTES


def test_areas_only_where_they_pay_and_fit(monkeypatch):
    assert stage_area.open_area(stage_area.MIN_BYTES - 1, gpu=False) is None
    monkeypatch.setattr(stage_area, "memory_folder", lambda: "/definitely/not/here")
    assert stage_area.open_area(stage_area.MIN_BYTES, gpu=False) is None


def test_a_batch_too_large_for_the_area_goes_to_a_fresh_file(tmp_path):
    sets = draws()
    (tmp_path / "area").mkdir()
    (tmp_path / "io").mkdir()
    area = stage_area.Area(tmp_path / "area", stage_area.area_bytes(sets[0], 1), gpu=False)
    data = tmp_path / "io" / "stage1.bin"
    with area:
        assert area.ready()
        manifest = WorkerHandle._write_stage(data, [0, 1, 2], lambda i: sets[i], area)
        assert data.stat().st_ino != area.path.stat().st_ino  # a fresh file, not the area
        got = staging.read_sets(str(data), manifest.to_json())
        assert torch.equal(got[2][0], sets[2][0])


@pytest.mark.gpu
@requires_cuda
def test_a_registered_area_takes_device_draws_by_dma():
    """On the GPU the area's pages are page-locked ahead; device draws land in them by DMA and reach a
    worker's device bit for bit, batch after batch."""
    sets = [[t.to("cuda") if isinstance(t, torch.Tensor) else t for t in xs] for xs in draws()]
    shm = memory_folder()
    if shm is None:
        pytest.skip("no room in /dev/shm: the judge's areas live there (disk-backed pages are never registered)")
    folder = Path(tempfile.mkdtemp(prefix="kfuse-test-area-", dir=shm))
    with stage_area.Area(folder, stage_area.area_bytes(sets[0], 3), gpu=True) as area:
        assert area.ready() and area.registered, (area.error, area.refused)
        assert area.how() == "registered"
        for batch in (sets, sets[::-1]):
            manifest = area.write(iter(batch)).to_json()
            link = folder / "stage.bin"  # a request folder's link: the same filesystem
            area.link(link)
            got, via = staging.device_sets(str(link), manifest, "cuda",
                                           lambda xs: [x.to("cuda") if isinstance(x, torch.Tensor) else x for x in xs])
            link.unlink()
            assert via == "registered"
            for want_set, got_set in zip(batch, got):
                for want, have in zip(want_set, got_set):
                    assert torch.equal(have, want) if isinstance(want, torch.Tensor) else have == want

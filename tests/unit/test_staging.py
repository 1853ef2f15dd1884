"""Timed calls' input sets as raw bytes in one file (kfuse/judge/staging.py): what the worker maps is exactly what
the judge drew, whatever the dtypes, shapes and plain values, and the worker's writes never reach the file."""

from __future__ import annotations

import pytest
import torch

from kfuse.judge import staging
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

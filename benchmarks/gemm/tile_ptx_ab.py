"""Is the GEMM tile the same code as at another commit? Compiles one kernel around gemm_core.gemm_tile for sm_90 on
the CPU (Triton's bundled ptxas target; no GPU needed), with the tile of the working tree and with the tile of
REV, for every path a kfuse config takes, and compares the PTX (debug line info and file names left out).

    python3 benchmarks/gemm/tile_ptx_ab.py [REV]    (default REV: HEAD)

Prints one line per path: identical or DIFFERENT.  Exit status 1 where any path differs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, not interpret (before triton is imported)

ROOT = Path(__file__).resolve().parents[2]
KERNEL = '''import triton
import triton.language as tl
from {core} import gemm_tile, _tile_ids


@triton.jit
def region_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, out_ptr, M, N, K,
                  stride_am, stride_ak, stride_bn, stride_bk,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr, K_SLICES: tl.constexpr,
                  A_BLOCKS: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,
                    stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A, EVEN_K,
                    K_SLICES=K_SLICES, A_BLOCKS=A_BLOCKS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc, mask=mask)
'''
# (name, A and B pointer types, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_A, EVEN_K, K_SLICES, A_BLOCKS, warps, stages)
PATHS = [
    ("fp16x3p", "pre-split", "*fp16", 128, 128, 64, False, True, 0, False, 8, 3),
    ("fp16x3p", "split in the kernel", "*fp32", 128, 128, 64, True, False, 0, False, 8, 3),
    ("fp16x3p", "row scales in the kernel", "*fp32", 64, 128, 64, 2, False, 0, False, 4, 3),
    ("fp16x3p", "column halves", "*fp16", 128, 256, 32, False, True, 0, False, 8, 4),
    ("fp16x3p", "A_BLOCKS (dW)", "*fp16", 128, 128, 64, False, True, 0, True, 8, 3),
    ("ieee", "", "*fp32", 128, 128, 32, True, False, 0, False, 8, 3),
    ("tf32x3", "", "*fp32", 128, 256, 32, True, False, 0, False, 8, 3),
    ("fp64", "K-slice partials", "*fp64", 2, 64, 16, True, False, 4, False, 4, 3),
    ("fp64", "in-tile", "*fp32", 16, 32, 64, True, False, 0, False, 4, 3),
]


def ptx(kernel, path) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    scheme, _, a_type, bm, bn, bk, split_a, even_k, k_slices, a_blocks, warps, stages = path
    b_type = "*fp16" if scheme == "fp16x3p" else a_type
    sig = {"a_ptr": a_type, "a_lo_ptr": a_type, "a_scale_ptr": "*fp32", "b_ptr": b_type, "b_lo_ptr": b_type,
           "b_scale_ptr": "*fp32", "out_ptr": "*fp32", **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_ak",
                                                                           "stride_bn", "stride_bk")}}
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SCHEME": scheme, "SPLIT_A": split_a,
              "EVEN_K": even_k, "K_SLICES": k_slices, "A_BLOCKS": a_blocks}
    sig |= {n: "constexpr" for n in consts}
    src = ASTSource(kernel, sig, constexprs={(i,): consts[p.name] for i, p in enumerate(kernel.params)
                                             if p.name in consts})
    text = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages}).asm["ptx"]
    text = text.split(".section\t.debug")[0]  # the debug sections hold the file names
    return [ln.split("//")[0].rstrip() for ln in text.splitlines()
            if not ln.strip().startswith((".file", ".loc", "//"))]


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    work = Path(tempfile.mkdtemp(prefix="tile_ptx_ab-"))
    old = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/kfuse/kernels/gemm_core.py"],
                         capture_output=True, text=True, check=True).stdout
    (work / "core_then.py").write_text(old)
    (work / "core_now.py").write_text((ROOT / "src/kfuse/kernels/gemm_core.py").read_text())
    for side in ("then", "now"):
        (work / f"kernel_{side}.py").write_text(KERNEL.format(core=f"core_{side}"))
    sys.path.insert(0, str(work))
    import kernel_now
    import kernel_then

    differ = 0
    for path in PATHS:
        same = ptx(kernel_then.region_kernel, path) == ptx(kernel_now.region_kernel, path)
        differ += not same
        print(f"{path[0]:8} {path[1]:26} {path[3]}x{path[4]}x{path[5]}: {'identical' if same else 'DIFFERENT'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

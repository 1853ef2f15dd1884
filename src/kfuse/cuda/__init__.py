"""The CUDA C++ backend (`kfuse optimize --backend cuda`): ModelNew files whose fused regions are CUDA C++ kernels
compiled with `torch.utils.cpp_extension.load_inline`, no Triton.

  regions.py         which region kinds this backend fuses (the registry's GEMM kinds, with their CUDA code) and
                     why the others stay torch calls
  spellings.py       the C++ functors (a GEMM's epilogue, the ops after a norm, a row's ops), spelled from the
                     pointwise table of kfuse/ops.py
  epilogue.py        the GEMM + pointwise kind's code, and the Python launcher / autograd pieces every GEMM kind shares
  norms.py           the GroupNorm and BatchNorm kinds' code: the GEMM into u, then the norm's pass
  rowsum.py          the row-sum kind's code: a float64 row dot product with W's row sums
  rowreduce.py       the row reduction / row norm kind's code
  pool.py            the pool kind's code
  glue.py            the two translation units' assembly, the C++ helpers, `Member` (a functor struct's member)
  gemm_source.py     the fixed CUDA source: the fp16 hi/lo row split, the fp32-accurate WMMA GEMM tile (fp16x3p),
                     the CUDA-core tile with float64 sums (--scheme ieee), the GEMV kernel for <= 16 rows, and
                     `kf_gemm`, which each region's GEMM functor plugs into
  gemm_sm90_source.py  the Hopper GEMM on CUTLASS (sm_90 with CUTLASS's headers)
  norm_source.py     the norm passes (GroupNorm per (row, group); BatchNorm column statistics and apply)
  rows_source.py     the row kinds' kernels: the row dot product, row statistics, the per-row and apply passes,
                     the pool pass
  runtime.py         the Python the generated file carries: build once per machine (content-hashed extension under
                     the cache folder), the weight split cache, the autograd Function bases
  emit.py            the standalone ModelNew file
"""

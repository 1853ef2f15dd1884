"""The CUDA C++ backend (`kfuse optimize --backend cuda`): ModelNew files whose fused regions are CUDA C++ kernels
compiled with `torch.utils.cpp_extension.load_inline`, no Triton.

  regions.py      which region kinds this backend fuses (the GEMM + pointwise epilogue so far) and why the others
                  stay torch calls
  spellings.py    each region's epilogue as a C++ functor, spelled from the pointwise table of kfuse/ops.py
  gemm_source.py  the fixed CUDA source: the fp16 hi/lo row split, the fp32-accurate WMMA GEMM tile (fp16x3p),
                  the CUDA-core tile with float64 sums (--scheme ieee), the GEMV kernel for <= 16 rows, and the
                  host glue each region's functor plugs into
  runtime.py      the Python the generated file carries: build once per machine (content-hashed extension under
                  the cache folder), the weight split cache, the autograd Function base
  emit.py         the standalone ModelNew file
"""

"""Every test runs Triton kernels in the CPU interpreter unless a GPU test says otherwise.

Shared helpers live in kfuse_testing.py: tests/judge has its own conftest, so `from conftest import` is ambiguous.
"""

import os

# before triton is imported anywhere; the GPU tests run with TRITON_INTERPRET=0 (`TRITON_INTERPRET=0 pytest -m gpu`),
# else their kernels would run in the interpreter on CUDA tensors
os.environ.setdefault("TRITON_INTERPRET", "1")

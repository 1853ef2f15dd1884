"""Every test runs Triton kernels in the CPU interpreter unless a GPU test says otherwise.

Shared helpers live in kfuse_testing.py: tests/judge has its own conftest, so `from conftest import` is ambiguous.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

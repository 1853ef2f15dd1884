"""kfuse: turn a small PyTorch model into a verified, faster drop-in model built on fused Triton kernels.

The pipeline, one module per stage:
    load -> capture -> rewrite -> partition -> codegen (regions/) -> emit -> verify -> report
"""

__version__ = "0.1.0"

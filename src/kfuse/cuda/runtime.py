"""What every `--backend cuda` ModelNew carries: the definitions its code reads, copied into it by name
(kfuse/library.py, CUDA_MODULES), with the helpers of kfuse/kernels/backward.py it shares with the Triton backend
(BatchNorm's forward state and reference, the autograd helpers imported below).

Build once per machine: `load_extension` names the extension after a hash of everything that decides the binary
(both sources, the bound functions, the flags, torch's and CUDA's versions, the GPU's compute capability) and
builds it with torch.utils.cpp_extension.load_inline into `<cache>/cuda/<name>/` (KFUSE_CACHE_DIR, default
~/.cache/kfuse). A later process finds `<name>.so` there beside the marker written after a successful build and
imports it directly (tens of milliseconds: no compiler, no ninja); two processes building the same name at once
are serialised by load_inline's own lock in that folder.

Operands (`gemm_operands`): x is split into fp16 hi/lo parts on every call (one CUDA kernel); the weight's parts
are kept on the weight tensor until its storage, version counter (bumped by every in-place write: optimizer steps,
load_state_dict, mul_ under no_grad), shape or strides change. Writes through `w.data` bypass the version counter:
set `w._kfuse_cuda_cache = None` after one. GEMMs of at most SKINNY_M rows take the GEMV kernel (kf_gemv_kernel:
W read once, float64 sums), whatever the scheme, and GEMMs of at most CUDA_CORE_MNK multiply-adds the CUDA-core tile
(double sums).

Training (`CudaGemmFn`): the forward kernel also stores z = x W^T + b; backward differentiates the epilogue in
float64 torch from z (each gradient rounded once), then dX = dZ W, dW = dZ^T X and db = sum(dZ) as fp32 torch
matmuls with TF32 off (eager's own arithmetic for these, so within the gradient contract's bounds).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import os

import torch

from kfuse.kernels.backward import _as_tuple, _caster, distinct_tensors

SKINNY_M = 16  # GEMMs of at most this many rows run the GEMV kernel, float64 sums (gemm_source.SKINNY_M)
# GEMMs of at most this many multiply-adds (M N K) run the CUDA-core tile in double whatever the scheme: there fp16x3p's
# truncated tensor-core sums missed rule 3 on positive data (K = 70: 2.2x eager's error) and the tile is no slower
# (H200: 256^3 0.095 ms against 0.137; benchmarks/cuda_backend/NOTES.md, "Products of two values")
CUDA_CORE_MNK = 2 ** 28
SCHEME_IDS = {"fp16x3p": 0, "ieee": 1, "fp64": 2}  # gemm_source.SCHEME_IDS
CUDA_FLAGS = ("-O3",)  # no -std: torch adds the one its headers need (C++20 since torch 2.10)
BUILT_MARK = "kfuse-built"
_EXTENSIONS: dict = {}  # (cuda_src, cpp_src, functions) -> the loaded module, in this process: a call's only look-up
# (Python caches a string's hash), where naming it (hashing the sources, finding CUTLASS's headers) cost a skinny
# GEMM its speed


def cache_folder() -> str:
    """Where built extensions live: $KFUSE_CACHE_DIR/cuda; else under $TORCH_EXTENSIONS_DIR, where a host that
    sets it keeps torch's own extensions (a judge's per-file compile cache: kfuse eval's sandbox has a throwaway
    home); else ~/.cache/kfuse/cuda."""
    if os.environ.get("KFUSE_CACHE_DIR"):
        return os.path.join(os.environ["KFUSE_CACHE_DIR"], "cuda")
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "kfuse_cuda")
    return os.path.join(os.path.expanduser("~"), ".cache", "kfuse", "cuda")


def cutlass_include():
    """CUTLASS's C++ headers: $CUTLASS_PATH/include (a CUTLASS checkout), else the copy the pip package
    nvidia-cutlass installs (cutlass_library/source/include; found without importing it); None where neither."""
    roots = [os.path.join(os.environ["CUTLASS_PATH"], "include")] if os.environ.get("CUTLASS_PATH") else []
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        roots += [os.path.join(loc, "source", "include") for loc in spec.submodule_search_locations]
    return next((r for r in roots if os.path.exists(os.path.join(r, "cutlass", "cutlass.h"))), None)


def sm90_headers():
    """CUTLASS's include folder where this build carries the Hopper GEMM (wgmma needs the sm_90a target): an sm_90
    GPU, the headers found, and KFUSE_CUDA_SM90 not set to 0 (which keeps the WMMA tile, e.g. to compare the two);
    else None."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and os.environ.get("KFUSE_CUDA_SM90", "1") != "0"):
        return None
    return cutlass_include()


def build_options() -> tuple:
    """(TORCH_CUDA_ARCH_LIST, nvcc's flags for the CUDA translation unit), from one look for the headers: for the
    Hopper GEMM 9.0a and CUDA_FLAGS with its macro and headers, else the user's setting and CUDA_FLAGS."""
    headers = sm90_headers()
    if headers is None:
        return os.environ.get("TORCH_CUDA_ARCH_LIST", ""), list(CUDA_FLAGS)
    return "9.0a", [*CUDA_FLAGS, "-DKF_SM90", f"-I{headers}", "--expt-relaxed-constexpr"]


def build_identity(options: tuple) -> str:
    """What besides the sources decides the binary: torch's and CUDA's versions, the GPU's compute capability,
    the architectures and the flags (with CUTLASS's include folder): `options` as build_options gives them."""
    archs, flags = options
    cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else ("none",)
    return "|".join([torch.__version__, str(torch.version.cuda), "sm_" + "".join(map(str, cap)), archs,
                     " ".join(flags)])


def extension_name(cuda_src: str, cpp_src: str, functions, identity: str) -> str:
    """`kfuse_<hash>`: the same sources, functions and build identity give the same name (and folder)."""
    h = hashlib.sha256()
    for part in (cuda_src, cpp_src, ",".join(functions), identity):
        h.update(part.encode())
        h.update(b"\0")
    return "kfuse_" + h.hexdigest()[:24]


def _import_built(name: str, folder: str):
    """The extension built earlier into `folder`, or None where it is not (completely) there."""
    path = os.path.join(folder, name + ".so")
    if not (os.path.exists(os.path.join(folder, BUILT_MARK)) and os.path.exists(path)):
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_extension(cuda_src: str, cpp_src: str, functions):
    """The compiled extension of these sources: from this process, from the cache folder, or built now."""
    if not torch.cuda.is_available():
        raise RuntimeError("kfuse: this ModelNew runs CUDA C++ kernels (kfuse optimize --backend cuda): it needs a "
                           "CUDA GPU and the CUDA toolkit (nvcc)")
    key = (cuda_src, cpp_src, tuple(functions))
    if key in _EXTENSIONS:
        return _EXTENSIONS[key]
    archs, flags = options = build_options()
    name = extension_name(cuda_src, cpp_src, functions, build_identity(options))
    folder = os.path.join(cache_folder(), name)
    module = _import_built(name, folder)
    if module is None:
        from torch.utils.cpp_extension import load_inline

        os.makedirs(folder, exist_ok=True)
        extra = {}
        if "no_implicit_headers" in inspect.signature(load_inline).parameters:  # torch >= 2.8: keep torch's
            extra["no_implicit_headers"] = True  # headers out of the CUDA file (the C++ one includes them itself)
        with arch_env(archs):
            module = load_inline(name=name, cpp_sources=[cpp_src], cuda_sources=[cuda_src],
                                 functions=list(functions), extra_cflags=["-O3"], extra_cuda_cflags=flags,
                                 build_directory=folder, **extra)
        with open(os.path.join(folder, BUILT_MARK), "w") as f:
            f.write(name + "\n")
    _EXTENSIONS[key] = module
    return module


@contextlib.contextmanager
def arch_env(archs: str):
    """TORCH_CUDA_ARCH_LIST set to `archs` (unset where empty) while torch builds, the user's value restored."""
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    else:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def tensor_key(t: torch.Tensor) -> tuple:
    """What a cache kept on a tensor compares to reuse a result: storage, version counter and layout."""
    return (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def cached_on(weight: torch.Tensor, tag, make):
    """make() computed once per (weight state, tag) and kept on the weight (see the module docstring)."""
    key = (tensor_key(weight), tag)
    slots = getattr(weight, "_kfuse_cuda_cache", None) or {}
    hit = slots.get(tag)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.no_grad():
        value = make()
    slots[tag] = (key, value)
    weight._kfuse_cuda_cache = slots
    return value


def weight_nk(weight: torch.Tensor, kn: bool) -> torch.Tensor:
    """W as (N, K) fp32 (a view: nn.Linear's layout, or the transpose of `x @ W`'s (K, N))."""
    w = weight.detach().float()
    return w.t() if kn else w


def gemm_operands(ext, x2: torch.Tensor, weight: torch.Tensor, kn: bool, scheme: str, cached: bool = True) -> tuple:
    """((a, a_scale, b, b_scale), scheme id) for the region functions of the extension: for "fp16x3p" x2 (M, K)
    and the weight split into [hi | lo] rows (split_rows), else both fp32 (N, K) contiguous with the scales unused
    (the CUDA-core tile; "fp64" for GEMMs of at most SKINNY_M rows, the GEMV kernel, or CUDA_CORE_MNK multiply-adds).
    `cached=False` (the second of two values, new every call): its (N, K) copy is made contiguous first, so the
    split reads rows, and nothing is kept on it."""
    if x2.shape[0] <= SKINNY_M or x2.shape[0] * x2.shape[1] * weight.shape[kn] <= CUDA_CORE_MNK:
        scheme = "fp64"
    if scheme == "fp16x3p":
        a = ext.split_rows(x2.float())
        if not cached:
            return (*a, *ext.split_rows(weight_nk(weight, kn).contiguous())), SCHEME_IDS[scheme]
        b = cached_on(weight, ("split", kn), lambda: tuple(ext.split_rows(weight_nk(weight, kn))))
        return (*a, *b), SCHEME_IDS[scheme]
    a = x2.float().contiguous()
    b = weight_nk(weight, kn).contiguous() if not cached else \
        cached_on(weight, ("nk", kn), lambda: weight_nk(weight, kn).contiguous())
    return (a, a, b, b), SCHEME_IDS[scheme]


def batched_gemm_operands(ext, x: torch.Tensor, y: torch.Tensor, scheme: str) -> tuple:
    """((a, a_scale, b, b_scale), scheme id) for the B products x[..., M, K] @ y[..., K, N] (the same leading dims,
    B their count) in one launch: a (B, M, .) and b (B, N, .), y's rows being its columns (its (N, K) transpose,
    copied), split as gemm_operands splits two values (scales (B, M) and (B, N)) or fp32 for the double-sum
    kernels: the GEMV where a product has at most SKINNY_M rows, the CUDA-core tile for at most CUDA_CORE_MNK
    multiply-adds in all."""
    M, K, N = x.shape[-2], x.shape[-1], y.shape[-1]
    x3 = x.float().reshape(-1, M, K)
    b3 = y.detach().float().reshape(-1, K, N).transpose(1, 2)  # (B, N, K)
    B = x3.shape[0]
    if M <= SKINNY_M or B * M * N * K <= CUDA_CORE_MNK:
        scheme = "fp64"
    if scheme == "fp16x3p":
        a, a_scale = ext.split_rows(x3.reshape(B * M, K))
        b, b_scale = ext.split_rows(b3.reshape(B * N, K))
        return (a.view(B, M, -1), a_scale.view(B, M), b.view(B, N, -1), b_scale.view(B, N)), SCHEME_IDS[scheme]
    a, b = x3.contiguous(), b3.contiguous()
    return (a, a, b, b), SCHEME_IDS[scheme]


def as_vector(t: torch.Tensor) -> torch.Tensor:
    """A parameter as the contiguous fp32 vector the epilogues index by column."""
    if t is None:
        raise ValueError("kfuse: a parameter this ModelNew's kernels read is None: construct ModelNew with the "
                         "arguments of the Model it was generated from")
    return t.detach().reshape(-1).float().contiguous()


def batch_norm_mode(bn) -> tuple:
    """(batch statistics?, update factor) for a BatchNorm's forward, doing torch's bookkeeping first: batch
    statistics in training mode or without running statistics; the factor (the momentum, or 1 / the batches counted
    when momentum is None) where training updates the running statistics, else -1."""
    batch = bn.training or bn.running_mean is None
    if not (bn.training and bn.track_running_stats):
        return batch, -1.0
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
    return batch, 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else float(bn.momentum)


@contextlib.contextmanager
def no_tf32():
    """fp32 matmuls as the contract's eager reference runs them (TF32 off), the user's flags restored."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


class CudaRegionFn(torch.autograd.Function):
    """What every region's Function shares: `run`, which applies the Function only where a gradient is needed."""

    @classmethod
    def run(cls, model, *inputs):
        """ModelNew.forward calls this: the Function when a gradient is needed, else the launcher alone. `inputs`:
        x (x and y for a product of two values)."""
        if not torch.is_grad_enabled():
            return cls.launch(model, *inputs)
        params = distinct_tensors(*cls.params(model))
        if any(t.requires_grad for t in (*inputs, *params)):
            return cls.apply(cls, model, *inputs, *params)
        return cls.launch(model, *inputs)


class CudaGemmFn(CudaRegionFn):
    """Autograd for one fused GEMM region z = x @ W^T + b (KN: x @ W) followed by its epilogue. Subclasses (one
    per region, generated) define:
      launch(model, x, save_z=False)  the CUDA launcher: the outputs (a tensor or a tuple); with save_z, the
                                      outputs as a tuple and z
      gemm(model)                     (W, b or None)
      params(model)                   every tensor the region reads that can need a gradient
      state(model)                    what each BatchNorm of the region normalizes with (batch_norm_state),
                                      taken before the launch; {} without one
      epilogue(model, fwd_state, cast, z)  the ops after the GEMM in torch, every parameter read through `cast`."""

    KN = False

    @staticmethod
    def state(model) -> dict:
        return {}

    @staticmethod
    def forward(ctx, cls, model, x, *params):
        ctx.cls, ctx.model, ctx.fwd_state = cls, model, cls.state(model)
        outs, z = cls.launch(model, x, save_z=True)
        ctx.save_for_backward(x, z, *params)  # the parameters for torch's in-place-modification check
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        x, z = ctx.saved_tensors[:2]
        cls, model = ctx.cls, ctx.model
        params = list(distinct_tensors(*cls.params(model)))  # the objects the epilogue reads
        need_x, need = ctx.needs_input_grad[2], list(ctx.needs_input_grad[3:])
        dz, epi = cls.epilogue_grads(model, ctx.fwd_state, z, grads, params, need)
        weight, bias = cls.gemm(model)
        dz2 = dz.reshape(-1, dz.shape[-1])
        dz32 = dz2.to(x.dtype)  # rounded once, as eager's dZ is
        x2 = x.detach().reshape(-1, x.shape[-1])
        w = weight.detach()
        dx = None
        with no_tf32():
            if need_x:
                dx = (dz32 @ (w.t() if cls.KN else w)).reshape(x.shape)
            got = []
            for p, nd, g in zip(params, need, epi):
                if not nd:
                    got.append(None)
                    continue
                extra = None
                if p is weight:
                    extra = x2.t() @ dz32 if cls.KN else dz32.t() @ x2
                elif p is bias:
                    extra = dz2.sum(0)
                if extra is not None:
                    extra = extra.reshape(p.shape).to(g.dtype if g is not None else extra.dtype)
                    g = extra if g is None else g + extra
                got.append(None if g is None else g.to(p.dtype))
        return (None, None, dx, *got)

    @classmethod
    def epilogue_grads(cls, model, fwd_state: dict, z, grads, params: list, need: list) -> tuple:
        """dZ (float64) and each needed parameter's gradient through the epilogue (float64, None where not read),
        from the epilogue recomputed in float64 from the kernel's z."""
        work = torch.float64
        wrt = [p for p, nd in zip(params, need) if nd]
        with torch.enable_grad():
            zd = z.detach().to(work).requires_grad_(True)
            outs = _as_tuple(cls.epilogue(model, fwd_state, _caster(work), zd))
            pairs = [(o, g.to(work)) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            got = [None] * (1 + len(wrt))
            if pairs:
                got = list(torch.autograd.grad([o for o, _ in pairs], [zd, *wrt], [g for _, g in pairs],
                                               allow_unused=True))
        dz = got[0] if got[0] is not None else torch.zeros_like(zd)
        it = iter(got[1:])
        return dz, [next(it) if nd else None for nd in need]


class CudaProductFn(CudaGemmFn):
    """Autograd for one fused region z = x @ y of two values (y 2-d, (K, N), or a batch of products: y (..., K, N)
    with x's leading dims) followed by its epilogue. Subclasses (one per region, generated) define launch(model, x,
    y, save_z=False), params(model), state(model) and epilogue(model, fwd_state, cast, z) as for CudaGemmFn; y is an
    input, so there is no gemm(model). Backward: the epilogue in float64 from z, then dX = dZ y^T and dY = X^T dZ
    (per product) as fp32 torch matmuls (TF32 off)."""

    @staticmethod
    def forward(ctx, cls, model, x, y, *params):
        ctx.cls, ctx.model, ctx.fwd_state = cls, model, cls.state(model)
        outs, z = cls.launch(model, x, y, save_z=True)
        ctx.save_for_backward(x, y, z, *params)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        x, y, z = ctx.saved_tensors[:3]
        cls, model = ctx.cls, ctx.model
        params = list(distinct_tensors(*cls.params(model)))
        need_x, need_y, need = ctx.needs_input_grad[2], ctx.needs_input_grad[3], list(ctx.needs_input_grad[4:])
        dz, epi = cls.epilogue_grads(model, ctx.fwd_state, z, grads, params, need)
        xd, yd = x.detach(), y.detach().to(x.dtype)
        with no_tf32():
            if y.dim() > 2:  # a batch of products (x's leading dims): each product's gradients
                dz32 = dz.reshape(*x.shape[:-1], dz.shape[-1]).to(x.dtype)  # rounded once, as eager's dZ is
                dx = dz32 @ yd.transpose(-1, -2) if need_x else None
                dy = xd.transpose(-1, -2) @ dz32 if need_y else None
            else:
                dz32 = dz.reshape(-1, dz.shape[-1]).to(x.dtype)
                dx = (dz32 @ yd.t()).reshape(x.shape) if need_x else None
                dy = xd.reshape(-1, x.shape[-1]).t() @ dz32 if need_y else None
        got = [None if g is None else g.to(p.dtype) for p, g in zip(params, epi)]
        return (None, None, dx, None if dy is None else dy.to(y.dtype), *got)


class CudaRecomputeFn(CudaRegionFn):
    """Autograd for a fused region whose backward recomputes it in float64 torch (the row sum of a GEMM, a GEMV):
    subclasses (generated) define launch(model, x), params(model), state(model) where the region has a BatchNorm
    (what it normalizes with, taken before the launch) and reference(model, fwd_state, cast, x), the region in torch
    with every parameter read through `cast`."""

    @staticmethod
    def state(model) -> dict:
        return {}

    @staticmethod
    def forward(ctx, cls, model, x, *params):
        ctx.cls, ctx.model, ctx.fwd_state = cls, model, cls.state(model)
        ctx.save_for_backward(x, *params)
        return cls.launch(model, x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        x, *params = ctx.saved_tensors
        cls, model = ctx.cls, ctx.model
        work = torch.float64
        need_x, need = ctx.needs_input_grad[2], list(ctx.needs_input_grad[3:])
        wrt = [p for p, nd in zip(params, need) if nd]
        with torch.enable_grad():
            xd = x.detach().to(work).requires_grad_(need_x)
            outs = _as_tuple(cls.reference(model, ctx.fwd_state, _caster(work), xd))
            pairs = [(o, g.to(work)) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            targets = ([xd] if need_x else []) + wrt
            got = list(torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs],
                                           allow_unused=True)) if pairs and targets else [None] * len(targets)
        it = iter(got)
        dx = next(it) if need_x else None
        dps = [next(it) if nd else None for nd in need]
        return (None, None, None if dx is None else dx.to(x.dtype),
                *[None if g is None else g.to(p.dtype) for g, p in zip(dps, params)])

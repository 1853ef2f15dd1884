"""Training support every generated ModelNew carries (the definitions its code reads are copied into it by name:
kfuse/library.py; the CUDA backend's files take BatchNorm's forward state and the autograd helpers from here too).

Each fused region gets a generated spec class (kfuse/backward.py: its launch, params, reference, ...), which
`autograd_fn` combines, on its first call, with one of the two bases here into a `torch.autograd.Function`
(the spec has no base of its own, so the generated file can define it before this library):

  FusedRegionFn  forward: the region's fused launcher. backward: the region recomputed in plain torch from the
                 saved inputs and differentiated with torch.autograd.grad. Eager math, so the gradients meet
                 the accuracy contract by construction; correct for every region kind.
  FusedGemmFn    a region anchored on a GEMM z = x @ W^T + b (nn.Linear) or z = x @ W: the forward kernel also
                 stores z where the launcher can (launch_z; else backward recomputes it with `gemm_nt`), dZ
                 comes from the generated epilogue-backward kernel (fused_dz: pointwise epilogues, one-tile
                 GroupNorms, BatchNorms with batch statistics) or from the epilogue differentiated in torch
                 (other norms, eval-mode BatchNorm), then the two backward GEMMs run as kernels:
                     dX = dZ @ W       (M x N x K)      dW = dZ^T @ X   (N x M x K)      db = sum_rows(dZ)
                 Flops: 2 x 2*M*N*K (3 x where z is recomputed), as eager's; saved activations: x and z.

`gemm_nt` is the fp32-accurate GEMM core's tile (kernels/gemm_core.py, same SCHEME switch) as a plain
A (M, K) @ B (N, K)^T with any operand strides: on a GPU the split schemes run it on fp16 tensor cores at fp32
accuracy; in the CPU interpreter it is the "ieee" fp32 dot.

The Function is used only when a gradient is needed (grad mode on and an input or parameter requires grad);
otherwise `run` calls the launcher directly, so inference costs what it did.
BatchNorm: the forward reads `bn.training` at call time (and updates the running statistics once); `state`
records whether batch statistics were used (and, if not, the running statistics then), so backward
differentiates exactly what the forward computed and never touches the buffers again.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kfuse.kernels.backward_ops import split_dzt_blocks, split_rows_any
from kfuse.kernels.gemm_core import (
    SPLIT_SCHEMES,
    _tile_ids,
    cdiv,
    default_config,
    gemm_tile,
    row_scales,
    split_weight,
    supports,
)
from kfuse.kernels.runtime import cached_split, gemm_scheme, tensor_key, tuned_gemm
from kfuse.kernels.skinny import fp64_partials


# --- emitted below ---
@triton.jit
def gemm_nt_kernel(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, out_ptr, M, N, K,
                   stride_am, stride_ak, stride_bn, stride_bk,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SCHEME: tl.constexpr, SPLIT_A: tl.constexpr, EVEN_K: tl.constexpr, K_SLICES: tl.constexpr,
                   A_BLOCKS: tl.constexpr = False, TRANS_OUT: tl.constexpr = False):
    """out (M, N) fp32 = A (M, K) @ B (N, K)^T: the backward GEMMs. Bytes: A and B read once per tile
    row/column (shared through L2 by the grouped order), out written once; 2*M*N*K flops.
    K_SLICES > 0 (skinny "fp64"): A is skinny.fp64_partials' float64 K-slice sums, added here.
    A_BLOCKS: A split per stretch of K, B unscaled (gemm_dw_presplit; gemm_tile says how). TRANS_OUT: out is
    stored transposed, (N, M) row-major (dW of an `x @ W` region, whose W is (K, N))."""
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = gemm_tile(a_ptr, a_lo_ptr, a_scale_ptr, b_ptr, b_lo_ptr, b_scale_ptr, pid_m, pid_n, M, N, K,
                    stride_am, stride_ak, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, SCHEME, SPLIT_A, EVEN_K,
                    K_SLICES=K_SLICES, A_BLOCKS=A_BLOCKS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if TRANS_OUT:
        tl.store(out_ptr + offs_n[None, :].to(tl.int64) * M + offs_m[:, None], acc, mask=mask)
    else:
        tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc, mask=mask)


def _parts(b: torch.Tensor, cache: tuple | None) -> tuple:
    """fp16 hi/lo parts of B's rows; with cache=(parameter, tag), kept on the parameter until its version
    changes (a slot apart from the forward's, which splits the other layout). Uncached (X^T for dW): one
    Triton split reading B's storage as it lies (split_rows_any), no torch transpose copy."""
    if cache is None:
        return split_rows_any(b)
    owner, tag = cache
    key = (tensor_key(owner), tag)
    slots = getattr(owner, "_kfuse_bwd_split", None) or {}
    hit = slots.get(tag)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.no_grad():
        parts = split_weight(b)
    slots[tag] = (key, parts)
    owner._kfuse_bwd_split = slots
    return parts


def gemm_nt(a: torch.Tensor, b: torch.Tensor, cache: tuple | None = None, b_parts: tuple | None = None,
            a_amax: torch.Tensor | None = None) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T -> (M, N) fp32, any strides (transposed views are fine), no autograd.
    `cache`: (parameter, tag) to keep b's split on; `b_parts`: b's split when the caller has it; `a_amax`:
    max |a[m, :]| per row where the caller has it (split_rows_any).
    The tile config comes from the forward's autotuner (runtime.tuned_gemm: timed once per shape on a GPU,
    kept on disk), so dX and dW run the config measured fastest for their own shapes."""
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0 or K == 0:
        return torch.zeros((M, N), device=a.device, dtype=torch.float32)
    a, b = a.float(), b.float()
    scheme = gemm_scheme(a)
    split = scheme in SPLIT_SCHEMES
    b_hi, b_lo, b_s = (b_parts if b_parts is not None else _parts(b, cache)) if split else (b, b, b)
    a_split = []  # a's hi/lo split, made once (tuning launches several configs)

    def launch(cfg):
        split_a = False
        if scheme == "fp64" and cfg.k_slices:  # skinny: float64 K-slice partials, added by the tile
            part, strides = fp64_partials(a, b, cfg)
            ops = (part,) * 6
        elif not split:
            ops, strides = (a, a, a, b, b, b), (*a.stride(), *b.stride())
        else:
            # in-register split of a needs K-contiguous rows; a transposed dZ^T goes pre-split instead
            split_a = cfg.split_a if a.stride(1) == 1 else False
            if split_a:
                ops = (a, a, a if split_a == 2 else row_scales(a), b_hi, b_lo, b_s)  # 2: scales in the kernel
                strides = (*a.stride(), *b_hi.stride())
            else:
                if not a_split:
                    a_split.append(split_rows_any(a, a_amax))
                a_hi, a_lo, a_s = a_split[0]
                ops, strides = (a_hi, a_lo, a_s, b_hi, b_lo, b_s), (*a_hi.stride(), *b_hi.stride())
        out = torch.empty((M, N), device=a.device, dtype=torch.float32)
        grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n),)
        gemm_nt_kernel[grid](*ops, out, M, N, K, *strides, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                             BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SCHEME=scheme, SPLIT_A=split_a,
                             EVEN_K=K % cfg.block_k == 0, K_SLICES=cfg.k_slices, num_warps=cfg.num_warps,
                             num_stages=cfg.num_stages)
        return out

    return tuned_gemm(gemm_nt_kernel, a, N, scheme, 16, launch)[1]


def gemm_dw_presplit(dz: torch.Tensor, x_split: tuple, kn: bool = False) -> torch.Tensor:
    """dW = dZ^T X (N, K) fp32 for z = x W^T + b (nn.Linear layout), or its transpose X^T dZ (K, N) for z = x W
    (kn: W is (K, N); the kernel stores the tile transposed), with X taken as the forward GEMM's own split
    of x (x_split = (x_hi, x_lo, x_scale) from gemm_operands: hi + lo = x[m] * s[m], s[m] a power of two per row
    of x) instead of a second split of X^T (col_amax + split_t: 512 MiB moved at seed 39):
        dW[n, k] = sum_m (dZ[m, n] / s[m]) * (hi + lo)[m, k].
    Dividing by s[m] varies along the sum, so dZ^T / s is split per (row n, SCALE_BLOCK_K-long stretch of m)
    with its own power of two (split_dzt_blocks; one pass like split_t's) and the "fp16x3p" tile undoes each
    stretch's scale on that K block's fresh partial (gemm_tile A_BLOCKS: an FMA instead of the FADD). Every
    scaling is by a power of two (exact); each stretch keeps ~22 bits of its own largest value, as a per-row split
    would. The one new limit: dZ[m, n] / s[m] must not leave fp32's range, which needs |dZ| * max|x[m, :]| beyond
    ~2^141 (dW itself would overflow) or below ~2^-112."""
    x_hi, x_lo, x_scale = x_split
    M, N = dz.shape
    K = x_hi.shape[1]
    shape = (K, N) if kn else (N, K)
    if M == 0 or N == 0 or K == 0:
        return torch.zeros(shape, device=dz.device, dtype=torch.float32)
    a_hi, a_lo, a_inv = split_dzt_blocks(dz.float(), x_scale)

    def launch(cfg):
        if not supports(cfg, "fp16x3p", M, a_blocks=True):  # A_BLOCKS runs the plain 128x128 K loop only
            cfg = default_config(N, K, M, "fp16x3p")
        out = torch.empty(shape, device=dz.device, dtype=torch.float32)
        grid = (cdiv(N, cfg.block_m) * cdiv(K, cfg.block_n),)
        gemm_nt_kernel[grid](a_hi, a_lo, a_inv, x_hi, x_lo, x_scale, out, N, K, M,
                             a_hi.stride(0), a_hi.stride(1), x_hi.stride(1), x_hi.stride(0),
                             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                             SCHEME="fp16x3p", SPLIT_A=False, EVEN_K=M % cfg.block_k == 0, K_SLICES=0, A_BLOCKS=True,
                             TRANS_OUT=kn, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out

    # the same tuning key as gemm_nt's dW (same kernel and shape): its measured config, pre-split in any case
    return tuned_gemm(gemm_nt_kernel, dz.t(), K, "fp16x3p", 16, launch)[1]


def distinct_tensors(*ts) -> tuple:
    """The tensors among `ts`, each once (a parameter read twice gets its gradient once), Nones dropped."""
    seen, out = set(), []
    for t in ts:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return tuple(out)


def batch_norm_state(bn: torch.nn.Module):
    """What a BatchNorm normalizes with at this call: None for batch statistics (training, or no running
    statistics), else a copy of the running statistics (eval)."""
    if bn.training or bn.running_mean is None:
        return None
    return bn.running_mean.detach().clone(), bn.running_var.detach().clone()


def batch_statistics(state) -> bool:
    """Did every BatchNorm of the region normalize with batch statistics (state() None, or all its entries)?
    The fused dZ kernels compute those; running statistics (eval) keep the float64 torch backward."""
    return state is None or all(s is None for s in state.values())


def batch_norm_ref(y: torch.Tensor, bn: torch.nn.Module, saved, cast) -> torch.Tensor:
    """BatchNorm as the forward computed it (see batch_norm_state), leaving the running statistics alone."""
    w, b = cast(bn.weight), cast(bn.bias)
    if saved is None:
        return torch.nn.functional.batch_norm(y, None, None, w, b, True, 0.0, bn.eps)
    return torch.nn.functional.batch_norm(y, cast(saved[0]), cast(saved[1]), w, b, False, 0.0, bn.eps)


def _caster(dtype):
    """`cast` for the references: parameters converted to the working dtype, differentiably (the gradient
    flows back through the conversion and is rounded once, to the parameter's dtype)."""
    return lambda t: t if t is None or t.dtype == dtype else t.to(dtype)


def _as_tuple(outs) -> tuple:
    return outs if isinstance(outs, tuple) else (outs,)


def _cast_all(grads: tuple, dtype: torch.dtype) -> tuple:
    return tuple(g if g is None else g.to(dtype) for g in grads)


def _grads(outs: tuple, grads: tuple, wrt: list, need: list) -> list:
    """d(outs)/d(wrt) against the upstream `grads`, None where not needed or not reached."""
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    targets = [t for t, nd in zip(wrt, need) if nd]
    got = [None] * len(targets)
    if pairs and targets:
        got = list(torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True))
    it = iter(got)
    return [next(it) if nd else None for nd in need]


class FusedRegionFn(torch.autograd.Function):
    """Autograd for one fused region. Subclasses (one per region, generated) define:
      launch(model, *inputs)           the fused launcher call: what ModelNew.forward ran before training support;
      params(model)                    the tensors the region reads that can need a gradient;
      state(model)                     what backward must see as the forward saw it (BatchNorm's statistics);
      reference(model, state, cast, *inputs)  the region in plain torch, same outputs as launch, every
                                       parameter read through `cast`.
    Backward differentiates the recomputed torch ops in float64 (PRECISE) and rounds each gradient once:
    the pointwise and norm math is memory-bound, and its fp32 rounding would otherwise put our gradients at
    eager's noise level instead of safely inside the contract's 2x bound."""

    PRECISE = True  # False where a reference calls a module as-is (its fp32 parameters cannot be cast)

    @staticmethod
    def launch(model, *inputs):
        raise NotImplementedError

    @staticmethod
    def params(model) -> tuple:
        return ()

    @staticmethod
    def state(model):
        return None

    @staticmethod
    def reference(model, state, cast, *inputs):
        raise NotImplementedError

    @classmethod
    def work_dtype(cls, dtype: torch.dtype) -> torch.dtype:
        return torch.float64 if cls.PRECISE and dtype.is_floating_point else dtype

    @classmethod
    def run(cls, model, *inputs):
        """ModelNew.forward calls this: the Function when a gradient is needed, else the launcher alone."""
        if not torch.is_grad_enabled():  # inference: no parameter walk (small problems pay per call for it)
            return cls.launch(model, *inputs)
        params = distinct_tensors(*cls.params(model))
        if any(t.requires_grad for t in (*inputs, *params)):
            return cls.apply(cls, model, len(inputs), *inputs, *params)
        return cls.launch(model, *inputs)

    @staticmethod
    def forward(ctx, cls, model, n_in, *tensors):
        ctx.cls, ctx.model, ctx.n_in = cls, model, n_in
        ctx.state = cls.state(model)  # before the launch: BatchNorm's mode and statistics for this call
        outs, extra = cls.launch_saving(model, *tensors[:n_in])
        ctx.n_tensors = len(tensors)
        # x, the parameters (for torch's in-place-modification check) and what the launch kept for backward
        ctx.save_for_backward(*tensors, *extra)
        return outs

    @classmethod
    def launch_saving(cls, model, *inputs) -> tuple:
        """(outputs, tensors kept for backward): here the plain launch, nothing kept."""
        return cls.launch(model, *inputs), ()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        saved = ctx.saved_tensors  # raises if an input or parameter was modified in place since the forward
        cls, n = ctx.cls, ctx.n_in
        params = list(distinct_tensors(*cls.params(ctx.model)))  # the objects the reference reads
        need = list(ctx.needs_input_grad[3:])
        got = cls.region_backward(ctx.model, ctx.state, list(saved[:n]), params, grads, need,
                                  list(saved[ctx.n_tensors:]))
        return (None, None, None, *got)

    @classmethod
    def region_backward(cls, model, state, inputs: list, params: list, grads: tuple, need: list,
                        kept: list = ()) -> list:
        """Recompute the region in torch from the saved inputs and differentiate it."""
        work = cls.work_dtype(inputs[0].dtype)
        with torch.enable_grad():
            xs = [t.detach().to(work if t.is_floating_point() else t.dtype).requires_grad_(nd)
                  for t, nd in zip(inputs, need)]
            outs = _as_tuple(cls.reference(model, state, _caster(work), *xs))
            got = _grads(outs, _cast_all(grads, work), [*xs, *params], need)
        return [g if g is None or i >= len(inputs) else g.to(inputs[i].dtype) for i, g in enumerate(got)]


class FusedGemmFn(FusedRegionFn):
    """A region whose single input x feeds a GEMM z = x @ W^T + b (KN: z = x @ W) followed by the epilogue.
    Subclasses also define gemm(model) -> (W, b or None) and epilogue(model, state, cast, z) -> the outputs.
    The GEMMs are fp32 (gemm_nt); only the epilogue is differentiated in float64 (PRECISE), and dZ is rounded
    to x's dtype once before the backward GEMMs, as eager's dZ is."""

    KN = False  # W is (K, N) (`x @ W`) rather than nn.Linear's (N, K)
    launch_z = None  # generated where the launcher can also store z: (model, x) -> (outputs tuple, z or None)
    # generated where the region's kind has a fused backward (its `dz_plan`: pointwise epilogues, one-tile
    # GroupNorms, training-mode BatchNorms, the latter used only where the forward normalized with batch
    # statistics): (model, z, grads) -> (dZ, db float64, [each epilogue parameter's float64 gradient]), one
    # Triton kernel instead of the float64 torch epilogue
    fused_dz = None

    @staticmethod
    def gemm(model) -> tuple:
        raise NotImplementedError

    @staticmethod
    def epilogue(model, state, cast, z):
        raise NotImplementedError

    @classmethod
    def launch_saving(cls, model, *inputs) -> tuple:
        """The launch that also stores z = x W^T + b (M*N values of x's dtype kept until backward, which then
        skips a whole GEMM) and keeps x's fp16 split where the forward GEMM made one (the dW GEMM reads it:
        gemm_dw_presplit); the plain launch where the launcher cannot, or this call's path has no z."""
        if cls.launch_z is None:
            return cls.launch(model, *inputs), ()
        outs, kept = cls.launch_z(model, *inputs)  # (z, and x's split where the GEMM made one), () in eval
        if not cls.gemm(model)[0].requires_grad:
            kept = kept[:1]  # a frozen W needs no dW: x's split would only hold memory until backward
        return (outs[0] if len(outs) == 1 else outs), tuple(kept)

    @staticmethod
    def recompute_z(x2: torch.Tensor, weight: torch.Tensor, bias, kn: bool) -> torch.Tensor:
        """z = x W^T + b again by gemm_nt, for launches that did not keep it."""
        w_nk = weight.detach().t() if kn else weight.detach()
        with torch.no_grad():
            parts = cached_split(weight, kn) if gemm_scheme(x2) in SPLIT_SCHEMES else None
            z = gemm_nt(x2, w_nk, b_parts=parts)
            if bias is not None:
                z += bias.detach().float()
        return z

    @classmethod
    def region_backward(cls, model, state, inputs: list, params: list, grads: tuple, need: list,
                        kept: list = ()) -> list:
        (x,) = inputs
        weight, bias = cls.gemm(model)
        x2 = x.detach().reshape(-1, x.shape[-1])
        w_nk = weight.detach().t() if cls.KN else weight.detach()  # (N, K) either way
        z = kept[0].reshape(x2.shape[0], -1) if kept else cls.recompute_z(x2, weight, bias, cls.KN)
        x_split = tuple(kept[1:]) if len(kept) == 4 else None  # runtime.saved_for_backward
        n_out = z.shape[1]
        if cls.fused_dz is not None and batch_statistics(state):
            dz2, db, epi, dz_amax = cls.dz_fused(model, z, grads, params)
            return cls.gemm_grads(x, x2, w_nk, weight, bias, dz2, db, epi, params, need, dz_amax, x_split)
        work = cls.work_dtype(x.dtype)
        with torch.enable_grad():
            # z rounded to x's dtype, as the forward's kernel stored its values, then widened for the epilogue
            zd = z.to(x.dtype).to(work).reshape(*x.shape[:-1], n_out).requires_grad_(True)
            outs = _as_tuple(cls.epilogue(model, state, _caster(work), zd))
            dz, *got = _grads(outs, _cast_all(grads, work), [zd, *params], [True, *need[1:]])
        if dz is None:
            dz = torch.zeros_like(zd)
        db = dz.reshape(-1, n_out).sum(0)  # in the working dtype, rounded once below
        dz2 = dz.to(x.dtype).reshape(-1, n_out)
        return cls.gemm_grads(x, x2, w_nk, weight, bias, dz2, db, got, params, need, x_split=x_split)

    @classmethod
    def dz_fused(cls, model, z: torch.Tensor, grads: tuple, params: list) -> tuple:
        """dZ, db and the epilogue parameters' gradients (float64, summed per distinct parameter, None for a
        parameter the epilogue does not read) from the generated epilogue-backward kernel, and max_rows |dZ|."""
        dz2, db, pairs, dz_amax = cls.fused_dz(model, z.detach(), grads)
        epi = [None] * len(params)
        for t, g in pairs:  # matched by identity: the objects params() returns
            i = next(j for j, p in enumerate(params) if p is t)
            epi[i] = g if epi[i] is None else epi[i] + g
        return dz2, db, epi, dz_amax

    @classmethod
    def gemm_grads(cls, x, x2, w_nk, weight, bias, dz2, db, epi: list, params: list, need: list,
                   dz_amax: torch.Tensor | None = None, x_split: tuple | None = None) -> list:
        """dX = dZ W and dW = dZ^T X by gemm_nt; db and the epilogue's parameter gradients (`epi`, float64 or
        the parameter's dtype) added per parameter and rounded once to its dtype. `dz_amax`: max_rows |dZ| per
        column where the dZ kernel gave it (the split of dZ^T for dW then skips a pass); `x_split`: the forward's
        split of x where it kept one (dW then reads it: gemm_dw_presplit)."""
        dx = None
        if need[0]:
            dx = gemm_nt(dz2, w_nk.t(), cache=(weight, ("dx", cls.KN))).to(x.dtype).reshape(x.shape)
        got = list(epi)
        for i, (p, nd) in enumerate(zip(params, need[1:])):
            if not nd:
                got[i] = None
                continue
            extra = None
            if p is weight:
                if x_split is not None:
                    extra = gemm_dw_presplit(dz2, x_split, cls.KN)
                elif cls.KN:
                    extra = gemm_nt(x2.t(), dz2.t())
                else:
                    extra = gemm_nt(dz2.t(), x2.t(), a_amax=dz_amax)
            elif p is bias:
                extra = db
            if extra is not None:
                extra = extra.reshape(p.shape)
                got[i] = extra if got[i] is None else got[i] + extra
            if got[i] is not None:
                got[i] = got[i].to(p.dtype)
        return [dx, *got]


def autograd_fn(spec: type) -> type:
    """The autograd Function of a generated region spec: the spec's methods over FusedGemmFn's (spec.GEMM) or
    FusedRegionFn's, made once per spec."""
    fn = spec.__dict__.get("_autograd_fn")
    if fn is None:
        base = FusedGemmFn if getattr(spec, "GEMM", False) else FusedRegionFn
        fn = type(spec.__name__, (spec, base), {})
        spec._autograd_fn = fn
    return fn

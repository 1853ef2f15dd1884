"""The two translation units of a `--backend cuda` file and what every region's code plugs into.

CUDA_SRC: gemm_source.py's fixed kernels (the split, the GEMM tiles, the GEMV), the norm and row kinds' fixed
kernels where a region of the file needs them (CudaRegion.parts), then each region's functor structs and CUDA
launcher. It includes no torch header (fast to build, checkable with nvcc alone). CPP_SRC (load_inline's main.cpp,
torch/extension.h prepended; load_inline appends the bindings): the C++ helpers below, then each region's bound
function, which checks the tensors, allocates the outputs and calls its CUDA launcher through plain pointers.
`Member`: one member of a functor struct and what feeds it; the helpers at the end write the pieces every region's
launcher and bound function share.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfuse.cuda.conv_channels_source import CONV_CHANNELS
from kfuse.cuda.conv_direct_source import CONV_DIRECT
from kfuse.cuda.conv_norm_source import CONV_BATCH_NORM, CONV_NORM, CONV_NORM_DECLS
from kfuse.cuda.conv_operands_source import CONV_CPP
from kfuse.cuda.conv_pools_source import CONV_POOLS
from kfuse.cuda.conv_source import CONV, CONV_COMMON
from kfuse.cuda.gemm_source import COMMON, GEMM, PAD_K, PRELUDE, SPLIT
from kfuse.cuda.norm_source import BATCH_NORM, BATCH_NORM_DECLS, GROUP_NORM, ROW_CHUNKS
from kfuse.cuda.rows_source import ROW_DOT, ROWS

# The C++ translation unit's fixed part: its headers (load_inline, with no_implicit_headers on torch >= 2.8, adds
# none), then COMMON, then these helpers; load_inline appends the bindings.
CPP_HEADERS = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <vector>
"""

CPP_HELPERS = r"""
constexpr int64_t KF_PAD_K = PAD_K_VALUE;  // split rows' padding (gemm_source.PAD_K)
constexpr int64_t KF_INT_MAX = 2147483647;

static void kf_check(int err, const char* what) {
  TORCH_CHECK(err == 0, "kfuse: CUDA kernel ", what, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

static void kf_expect(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t dim,
                      const torch::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "kfuse: ", name, " must be a CUDA tensor (this ModelNew runs CUDA kernels)");
  TORCH_CHECK(t.device() == like.device(), "kfuse: ", name, " is on ", t.device(), ", expected ", like.device());
  TORCH_CHECK(t.scalar_type() == dtype, "kfuse: ", name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.dim() == dim && t.is_contiguous(), "kfuse: ", name, " must be a contiguous ", dim, "-d tensor");
}

// parts (R, 2 CP) = [hi | lo] fp16 and scale (R,) fp32 of the rows of x (R, C) fp32 (any strides): CP = C padded
// to KF_PAD_K.
std::vector<torch::Tensor> split_rows(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32,
              "kfuse: split_rows takes a 2-d float32 CUDA tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t R = x.size(0), C = x.size(1), CP = (C + KF_PAD_K - 1) / KF_PAD_K * KF_PAD_K;
  TORCH_CHECK(R <= KF_INT_MAX && 2 * CP <= KF_INT_MAX, "kfuse: split_rows: too many rows or columns");
  auto parts = torch::empty({R, 2 * CP}, x.options().dtype(torch::kFloat16));
  auto scale = torch::empty({R}, x.options());
  kf_check(kf_split_rows(x.data_ptr<float>(), x.stride(0), x.stride(1), R, C, CP, parts.data_ptr(),
                         scale.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()),
           "kf_split_rows_kernel");
  return {parts, scale};
}

// The GEMM operands as the Python launcher passes them (runtime.gemm_operands), checked; `batched`: a batched
// product's (runtime.batched_gemm_operands), a (B, M, .) and b (B, N, .) with scales (B, M) and (B, N).
static KfGemmArgs kf_gemm_args(const torch::Tensor& a, const torch::Tensor& a_scale, const torch::Tensor& b,
                               const torch::Tensor& b_scale, int64_t scheme, bool batched = false) {
  TORCH_CHECK(scheme >= 0 && scheme <= 2, "kfuse: unknown GEMM scheme ", scheme);
  const bool split = scheme == 0;
  const auto dtype = split ? torch::kFloat16 : torch::kFloat32;
  const int64_t dim = batched ? 3 : 2;
  kf_expect(a, "x", dtype, dim, a);
  kf_expect(b, "the weight", dtype, dim, a);
  const int64_t batch = batched ? a.size(0) : 1;
  TORCH_CHECK(!batched || b.size(0) == batch, "kfuse: a batched product's operands disagree on the batch: ",
              a.size(0), " and ", b.size(0));
  const int64_t M = a.size(-2), N = b.size(-2), K = a.size(-1);
  TORCH_CHECK(b.size(-1) == K, "kfuse: GEMM operands disagree on K: ", K, " and ", b.size(-1));
  TORCH_CHECK(M <= KF_INT_MAX && N <= KF_INT_MAX, "kfuse: GEMM too large for int row indices");
  KfGemmArgs g{static_cast<int>(scheme), M, N, K, a.data_ptr(), nullptr, b.data_ptr(), nullptr, batch};
  if (split) {  // [hi | lo], CP columns each (split_rows)
    TORCH_CHECK(K % (2 * KF_PAD_K) == 0, "kfuse: split operands must be two segments padded to ", KF_PAD_K,
                " columns");
    kf_expect(a_scale, "x's row scales", torch::kFloat32, dim - 1, a);
    kf_expect(b_scale, "the weight's row scales", torch::kFloat32, dim - 1, a);
    TORCH_CHECK(a_scale.numel() == batch * M && b_scale.numel() == batch * N,
                "kfuse: split parts and their scales of different lengths");
    g.K = K / 2;
    g.a_scale = a_scale.data_ptr<float>();
    g.b_scale = b_scale.data_ptr<float>();
  }
  return g;
}

// A contiguous float32 vector of n elements on the GEMM's device: a per-column (N,) or single-element (1,)
// epilogue parameter, or a BatchNorm's running statistic (updated in place).
static float* kf_vector(const torch::Tensor& p, int64_t n, const char* name, const torch::Tensor& like) {
  kf_expect(p, name, torch::kFloat32, 1, like);
  TORCH_CHECK(p.size(0) == n, "kfuse: ", name, " has ", p.size(0), " elements, expected ", n);
  return p.data_ptr<float>();
}

""".replace("PAD_K_VALUE", str(PAD_K))

# The C++ helpers only the norm regions call (in a translation unit that has one).
NORM_CPP = r"""
// An optional affine vector of a norm: nullptr where the Python launcher passed an empty tensor (no affine).
static const float* kf_optional_vector(const torch::Tensor& p, int64_t n, const char* name, const torch::Tensor& like) {
  return p.numel() == 0 ? nullptr : kf_vector(p, n, name, like);
}
"""

# The fixed CUDA parts a region may need beyond the GEMM's (CudaRegion.parts), in the order they are written; the
# row chunking goes before the first part that uses it.
FIXED_PARTS = (("group_norm", GROUP_NORM), ("batch_norm", BATCH_NORM), ("row_dot", ROW_DOT), ("rows", ROWS),
               ("conv", CONV), ("conv_direct", CONV_DIRECT), ("conv_norm", CONV_NORM),
               ("conv_channels", CONV_CHANNELS), ("conv_batch_norm", CONV_BATCH_NORM), ("conv_pools", CONV_POOLS))
CHUNKED = ("batch_norm", "rows")


@dataclass(frozen=True)
class Member:
    """One member of a region's epilogue struct, and what feeds it from the Python launcher."""

    name: str  # C++ member (and wrapper parameter) name
    kind: str  # "out" (an output), "z" (x W^T + b for backward), "saved" (an (M, N) value an earlier kernel
    # stored), "row" (an (M,) value an earlier kernel stored), "vector" (N,), "single" (1,), "scalar"
    value: str = ""  # the Python launcher expression (vectors, singles and scalars)

    @property
    def c_type(self) -> str:
        return {"out": "float*", "z": "float*", "saved": "const float*", "row": "const float*",
                "vector": "const float*", "single": "const float*",
                "scalar": "float"}[self.kind]


def _conv_common(parts: set[str]) -> list[str]:
    """The convolution's argument struct and pack declaration, in both translation units where a region needs them."""
    return [CONV_COMMON.strip()] if "conv" in parts else []


def cuda_source(regions: list[str], parts: set[str]) -> str:
    """The whole CUDA translation unit: the GEMM's fixed kernels, the fixed `parts` the regions need (FIXED_PARTS'
    names), then each region's functor structs and launcher."""
    fixed = [src.strip() for name, src in FIXED_PARTS if name in parts]
    chunks = [ROW_CHUNKS.strip()] if parts & set(CHUNKED) else []
    return "\n".join([COMMON.strip(), *_conv_common(parts), PRELUDE.strip(), SPLIT.strip(), GEMM.strip(), *chunks,
                      *fixed, *[r.strip() for r in regions]]) + "\n"


def cpp_source(regions: list[str], parts: set[str]) -> str:
    """The C++ translation unit (load_inline appends the bindings); the norm helpers where a norm region needs them."""
    norm = [NORM_CPP.strip()] if parts & {"group_norm", "batch_norm", "conv_norm"} else []
    decls = [*([BATCH_NORM_DECLS.strip()] if "batch_norm" in parts else []),
             *([CONV_NORM_DECLS.strip()] if "conv_norm" in parts else [])]
    conv = [CONV_CPP.strip()] if "conv" in parts else []
    return "\n".join([CPP_HEADERS.strip(), COMMON.strip(), *_conv_common(parts), *decls, CPP_HELPERS.strip(), *norm,
                      *conv, *[r.strip() for r in regions]]) + "\n"


def bound_name(stem: str) -> str:
    """The Python-visible function of a region (prefixed: a stem such as `matmul` must not meet torch's names)."""
    return f"kf_{stem}"


def launcher_head(stem: str, params: list[str]) -> str:
    """The CUDA launcher's signature `int kf_launch_<stem>(...)`: defined in CUDA_SRC, declared in CPP_SRC."""
    return f"int kf_launch_{stem}({', '.join(params)})"


def c_param(m: Member, prefix: str = "") -> str:
    """A member as a CUDA launcher's parameter."""
    return f"{m.c_type} {prefix}{m.name}"


def cpp_param(m: Member, prefix: str = "") -> str:
    """An input member as a bound C++ function's parameter: a tensor (vectors, singles) or a double (scalars)."""
    return f"{'torch::Tensor' if m.kind in ('vector', 'single') else 'double'} {prefix}{m.name}"


def cpp_arg(m: Member, prefix: str = "") -> str:
    """What a bound C++ function passes its CUDA launcher for an input member: a checked pointer or a float."""
    name = prefix + m.name
    if m.kind in ("vector", "single"):
        return f'kf_vector({name}, {"g.N" if m.kind == "vector" else "1"}, "{m.name}", a)'
    return f"static_cast<float>({name})"


def inputs(members: list[Member]) -> list[Member]:
    """The members fed from the Python launcher (parameters and numbers)."""
    return [m for m in members if m.kind in ("vector", "single", "scalar")]


GEMM_OPERANDS = ("torch::Tensor a", "torch::Tensor a_scale", "torch::Tensor b", "torch::Tensor b_scale",
                 "int64_t scheme")  # a GEMM region's bound function takes these first (runtime.gemm_operands)


def bound_opening(stem: str, launch: list[str], params: list[str], checks=(), batched: bool = False) -> list[str]:
    """The start of a GEMM region's bound C++ function: the CUDA launcher's declaration (its parameters `launch`),
    the signature (the GEMM's operands, `params`, store_z), the operands checked (`batched`: a batched product's),
    the device guard, `checks`."""
    return [launcher_head(stem, launch) + ";", "",
            f"std::vector<torch::Tensor> {bound_name(stem)}({', '.join([*GEMM_OPERANDS, *params, 'bool store_z'])}) {{",
            f"  const KfGemmArgs g = kf_gemm_args(a, a_scale, b, b_scale, scheme{', true' if batched else ''});",
            "  const c10::cuda::CUDAGuard guard(a.device());",
            "  const auto options = a.options().dtype(torch::kFloat32);",
            *[f"  {c}" for c in checks]]


def launch_and_return(stem: str, args: list[str], outs) -> list[str]:
    """The end of a GEMM region's bound C++ function: the CUDA launcher's call, the outputs (then z) returned."""
    return [f"  kf_check(kf_launch_{stem}(g, {', '.join(args)}, c10::cuda::getCurrentCUDAStream()),",
            f'           "{bound_name(stem)}");',
            f"  std::vector<torch::Tensor> outs{{{', '.join(outs)}}};",
            "  if (store_z) outs.push_back(z);",
            "  return outs;",
            "}"]

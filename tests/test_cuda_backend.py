"""`--backend cuda` (kfuse/cuda/): what a machine without a GPU can check, and the GPU tests (marked gpu).

Without a GPU: every pointwise op has a CUDA spelling that computes what torch does (compiled with g++ on the host
where there is one), the partition and the reasons for what stays a torch call, the emitted file (parses, imports no
Triton, every launched kernel and bound function is defined, balanced source, imports and builds ModelNew on the
CPU), the CUDA source compiles with nvcc for sm_80 and sm_90 without spills (where nvcc is installed), the C++ glue
compiles against torch's headers (where g++ is), the runtime's cache logic, and autograd through CudaGemmFn with the
kernel replaced by torch. With a GPU: the seeds and odd sizes meet the accuracy contract, the gradient contract holds,
and a second process loads the built extension in under a second.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from kfuse.cuda import gemm_source, runtime
from kfuse.cuda.regions import KINDS, unfused_reasons
from kfuse.load import load_problem
from kfuse.modes import variants
from kfuse.ops import POINTWISE
from kfuse.optimize import Compiled, Options, capture_problem, compile_problem, load_module
from kfuse_testing import ROOT, SEEDS, SMALL, requires_cuda, unreached_names, write_problem

GEMM = ROOT / "problems" / "gemm"
# problems/gemm files whose emitted files are checked: two regions, x @ W (K, N), a batch of 1, every activation
GEMM_SAMPLE = ["02_gemm_gelu_tanh_scale", "06_matmul_scale_residual_clamp_logsumexp_mish", "07_matmul_mish_mish",
               "13_gemm_scaling_hardtanh_gelu", "24_gemm_swish_divide_clamp_tanh_clamp",
               "29_matmul_add_swish_tanh_gelu_hardtanh", "35_mlp_linear_relu_linear", "36_matmul_kn_param_tanh_scale",
               "37_gemm_softplus_hardswish_batch1", "19_matmul_dropout_mean_softmax", "04_gemm_divide_sum_scaling",
               "05_matmul_sum_max_avg_logsumexp"]
PROBLEMS = [*sorted(SEEDS.glob("*.py")), *[GEMM / f"{n}.py" for n in GEMM_SAMPLE]]
# CUDA math functions the spellings may call (libdevice; accurate versions, no fast-math intrinsics)
CUDA_MATH = {"tanhf", "erff", "expf", "expm1f", "log1pf", "logf", "fabsf", "fmaxf", "fminf", "sqrtf"}
NVCC_FLAGS = ["-O3", "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr"]


def compile_cuda(path: Path, overrides: dict | None = None, device: str = "cpu") -> Compiled:
    return compile_problem(load_problem(path, overrides or {}), Options(device=device, backend="cuda"))


def prelude_functions() -> set[str]:
    return set(re.findall(r"__device__ __forceinline__ \w+ (kf_\w+)\(", gemm_source.PRELUDE))


# ---- the op table ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", sorted(POINTWISE))
def test_every_pointwise_op_has_a_cuda_spelling(op):
    spec = POINTWISE[op]
    assert spec.cuda, f"{op}: no CUDA spelling in kfuse/ops.py"
    operands = [f"a{i}" for i in range(spec.arity)]
    text = spec.cuda.format(*operands)
    assert all(o in text for o in operands[:1]), text
    assert not re.search(r"\{\d+\}", text), text
    # float literals only: a double literal would promote the whole expression to double
    assert not re.search(r"\d\.\d*(?![\df])|\d[eE][-+]?\d+(?![\df])", text), f"{op}: double literal in {text}"
    called = set(re.findall(r"([A-Za-z_]\w*)\s*\(", text))
    assert called <= CUDA_MATH | prelude_functions(), f"{op}: calls {called - CUDA_MATH - prelude_functions()}"


# (extra operands per op, in the order the table takes them)
EXTRA = {"add": (0.75,), "sub": (-1.25,), "mul": (2.5,), "div": (3.0,), "leaky_relu": (0.1,),
         "hardtanh": (-0.5, 0.7), "clamp_min": (-0.25,), "clamp_max": (0.3,), "softplus": (2.0, 5.0)}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cuda_spellings_compute_what_torch_computes(tmp_path):
    """Each spelling compiled as host C++ (the same libm functions by name) against the op's torch reference in
    float64, over values from -30 to 30 and around the kinks."""
    xs = [v / 8 for v in range(-240, 241)] + [-1e-3, 1e-3, -3.0, 3.0, 20.0, 20.5, 88.0, -88.0]
    prelude = "\n".join(ln.replace("__device__ __forceinline__ ", "") for ln in gemm_source.PRELUDE.splitlines()
                        if ln.startswith("__device__ __forceinline__ float kf_m"))
    fns, calls = [], []
    for op, spec in sorted(POINTWISE.items()):
        args = ["x", *[f"e{i}" for i in range(spec.arity - 1)]]
        fns.append(f"static float op_{op}(float x, float e0, float e1) {{ (void)e0; (void)e1; "
                   f"return {spec.cuda.format(*args)}; }}")
        extra = [*EXTRA.get(op, ()), 0.0, 0.0][:2]
        calls.append(f'for (float x : xs) std::printf("{op} %.9e\\n", op_{op}(x, {extra[0]}f, {extra[1]}f));')
    src = ("#include <math.h>\n#include <cstdio>\n" + prelude + "\n"
           + "\n".join(fns) + "\nint main() {\n  const float xs[] = {" + ", ".join(f"{x!r}f" for x in xs)
           + "};\n" + "\n".join(calls) + "\n}\n")
    (tmp_path / "ops.cpp").write_text(src)
    subprocess.run(["g++", "-O1", "-std=c++17", "ops.cpp", "-o", "ops"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "ops")], capture_output=True, text=True, check=True).stdout.split("\n")
    got: dict[str, list[float]] = {}
    for line in filter(None, out):
        op, value = line.split()
        got.setdefault(op, []).append(float(value))
    x32 = torch.tensor(xs, dtype=torch.float32)
    for op, spec in POINTWISE.items():
        extra = EXTRA.get(op, ())
        refs = []
        for x in (x32, x32.double()):  # torch's own fp32 result, and float64
            args = [torch.tensor(extra[0], dtype=x.dtype)] if op in ("add", "sub", "mul", "div") else extra
            refs.append(spec.ref(x, *args).double())
        ref32, ref64 = refs
        have = torch.tensor(got[op], dtype=torch.float64)
        # within a few times torch's own fp32 error, plus a few ulps: a wrong constant or formula is far outside
        bound = 4 * (ref32 - ref64).abs() + 1e-7 + 5e-7 * ref64.abs()
        bad = ((have - ref64).abs() > bound).nonzero().flatten().tolist()
        assert not bad, f"{op}: at x={xs[bad[0]]}: {float(have[bad[0]])} vs torch {float(ref32[bad[0]])}, " \
                        f"float64 {float(ref64[bad[0]])}"


# ---- partition ---------------------------------------------------------------------------------------------------
# a product of two values (no weight parameter to cache a split of) and an op after it
TWO_VALUES = ("self.fc = nn.Linear(in_features, in_features)", "return torch.relu(torch.matmul(self.fc(x), x.t()))")
# F.linear with a value for its weight: the Triton kind takes it, no CUDA kind does
LINEAR_OF_VALUES = ("self.fc = nn.Linear(in_features, in_features)", "return torch.relu(F.linear(self.fc(x), x))")


def test_cuda_partition_fuses_what_triton_fuses_and_says_why_the_rest_is_torch(tmp_path):
    """A row reduction after the GEMM (logsumexp) is fused with the ops around it, as the Triton backend fuses it;
    F.linear of two values stays a torch call with the ops after it, each with the reason; a pool after a convolution
    stays one by default (its CUDA version is off; tests/test_cuda_conv.py: the convolution's own)."""
    prob = load_problem(GEMM / "06_matmul_scale_residual_clamp_logsumexp_mish.py", {})
    (v,) = variants(capture_problem(prob, "cpu"), KINDS)
    assert [r.kind for r in v.regions if r.fused] == ["gemm_rowreduce"] and not v.unfused
    two = write_problem(tmp_path, *LINEAR_OF_VALUES, name="linear_of_values")
    (v,) = variants(capture_problem(load_problem(two, {}), "cpu"), KINDS)
    reasons = unfused_reasons(v)
    assert set(reasons) == set(v.unfused) and v.unfused
    assert any("fuses only a Linear or x @ W with a 2-d weight parameter" in why for why in reasons.values()), reasons
    conv = ROOT / "problems" / "conv" / "45_conv3d_avgpool3d_sigmoid_bias.py"
    (v,) = variants(capture_problem(load_problem(conv, {}), "cpu"), KINDS)
    assert any("conv_pool" in why and "CUDA version is off" in why for why in unfused_reasons(v).values()), \
        unfused_reasons(v)


def test_cuda_partition_fuses_the_seeds_norms():
    """Seeds 62 (GroupNorm) and 39 (BatchNorm1d): one region each, nothing left as a torch call."""
    for name, kind in (("62_matmul_groupnorm_leakyrelu_sum", "gemm_groupnorm"), ("39_gemm_scale_batchnorm",
                                                                                 "gemm_batchnorm")):
        (v,) = variants(capture_problem(load_problem(SEEDS / f"{name}.py", SMALL[name]), "cpu"), KINDS)
        assert [r.kind for r in v.regions] == [kind] and not v.unfused


def test_cuda_partition_fuses_the_whole_pointwise_chain():
    prob = load_problem(GEMM / "24_gemm_swish_divide_clamp_tanh_clamp.py", {})
    (v,) = variants(capture_problem(prob, "cpu"), KINDS)
    assert [r.kind for r in v.regions] == ["gemm_epilogue"] and not v.unfused
    assert len(v.regions[0].nodes) > 5


# ---- the emitted file --------------------------------------------------------------------------------------------
def _strip_c(src: str) -> str:
    """C++ source without comments and string/char literals (for counting brackets)."""
    src = re.sub(r"//[^\n]*|/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '""', src)


def _balanced(src: str) -> bool:
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for ch in _strip_c(src):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def emitted_constants(source: str) -> dict:
    """A --backend cuda file's CUDA_SRC, CPP_SRC and CUDA_FUNCTIONS, read without running the file."""
    return {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(source).body
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
            and n.targets[0].id in ("CUDA_SRC", "CPP_SRC", "CUDA_FUNCTIONS")}


def check_emitted(source: str) -> None:
    tree = ast.parse(source)
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("triton" in m for m in imported), imported
    ns = emitted_constants(source)
    cu, cpp, functions = ns["CUDA_SRC"], ns["CPP_SRC"], ns["CUDA_FUNCTIONS"]
    assert _balanced(cu) and _balanced(cpp)
    assert "#include <torch" not in cu  # the CUDA file builds without torch's headers
    for f in functions:  # every bound function is defined in the C++ source
        assert re.search(rf"std::vector<torch::Tensor> {f}\(", cpp), f
    called = set(re.findall(r"\bext\.(\w+)\(", source))
    assert called and called <= set(functions), called - set(functions)
    for launcher in set(re.findall(r"\b(kf_launch_\w+)\(", cpp)):  # declared and called there, defined here
        assert re.search(rf"^int {launcher}\(.*\) \{{$", cu, flags=re.M), launcher
    globals_ = set(re.findall(r"__global__ void (?:__launch_bounds__\([\w:<>, ]+\) )?(\w+)\(", cu))
    for kernel in re.findall(r"(\w+)(?:<[^<>;]*>)?<<<", cu):  # every launched kernel is defined
        assert kernel in globals_ or re.search(rf"auto {kernel} = (\w+)<", cu), kernel
    for struct in re.findall(r"\b((?:Epi|Conv)_\w+) epi;", cu):
        assert re.search(rf"^struct {struct} \{{", cu, flags=re.M), struct
    classes = [c for c in re.findall(r"^class (\w+Fn)\((?:CudaGemmFn|CudaProductFn|CudaRecomputeFn)\):", source,
                                     flags=re.M) if c != "CudaProductFn"]  # the regions' classes, not the runtime's
    model_new = source[source.index("class ModelNew(Model):"):]
    assert classes and all(f"{c}.run(self, " in model_new for c in classes)
    assert unreached_runtime(source) == []


def unreached_runtime(source: str) -> list[str]:
    """The runtime's top-level names in the file (between its first banner and the generated regions') that the
    generated code below does not read, directly or through other runtime definitions: the copy is by name."""
    lines = source.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("# -------") and "(kfuse/" in ln) + 1
    generated = next(i for i, ln in enumerate(lines) if ln.startswith("# -------") and "fused regions" in ln) + 1
    return unreached_names(source, range(first + 1, generated + 1), roots_from=range(generated + 1, len(lines) + 1))


def test_cuda_modules_define_each_name_once():
    """The CUDA backend's library modules (kfuse/library.py CUDA_MODULES) never define a name twice: the library
    would copy the earlier module's definition silently."""
    from kfuse.library import CUDA_MODULES, _module

    seen: dict[str, str] = {}
    for module, _ in CUDA_MODULES:
        for name in _module(module)[0]:
            assert name not in seen, f"{name} in {module} and {seen[name]}"
            seen[name] = module


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_emitted_file_is_complete(path):
    compiled = compile_cuda(path)
    assert compiled.fallback is None and compiled.backend == "cuda"
    assert any(r.fused for v in compiled.variants for r in v.regions)
    check_emitted(compiled.source)


def test_emitted_file_imports_and_builds_modelnew_on_the_cpu(tmp_path):
    """Nothing is compiled at import or construction (the extension is built on the first call, on a GPU): the
    file loads anywhere, ModelNew takes Model's state dict, and its forward says why it cannot run here."""
    path = SEEDS / "12_gemm_multiply_leakyrelu.py"
    prob = load_problem(path, SMALL["12_gemm_multiply_leakyrelu"])
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, SMALL["12_gemm_multiply_leakyrelu"]).source)
    module = load_module(out)
    model = prob.build()
    new = prob.build(cls=module.ModelNew)
    new.load_state_dict(model.state_dict(), strict=True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            new(*prob.inputs())


def test_header_names_the_unfused_ops_and_why(tmp_path):
    """F.linear of two values: the Linear before it fused, the product and the op after it left with reasons."""
    path = write_problem(tmp_path, *LINEAR_OF_VALUES, name="linear_of_values")
    head = compile_cuda(path).source.split("\n\n")[0].replace("\n#     ", " ")
    assert "gemm_epilogue: nn.Linear fc" in head
    assert "torch._C._nn.linear (--backend cuda fuses only a Linear or x @ W with a 2-d weight parameter" in head
    assert "torch.relu (--backend triton fuses it in a gemm_epilogue region, whose GEMM --backend cuda does not" in head


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("name,arch,std", [("35_mlp_linear_relu_linear", "90", "c++20"),
                                           ("36_matmul_kn_param_tanh_scale", "80", "c++17")])
def test_cuda_source_compiles_without_spills(tmp_path, name, arch, std):
    """Two regions in one translation unit (problems/gemm/35) and x @ W with a parameter epilogue (36): nvcc builds
    them for H100 and A100 (C++20, as torch >= 2.10 builds, and C++17), and no kernel spills registers (the GEMM
    tile keeps two 64 x 32 fp32 accumulators per warp; the GEMV kernel for 16 rows 16 x 2 double sums per lane)."""
    cu = ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", compile_cuda(GEMM / f"{name}.py").source,
                                    re.S).group(1))
    (tmp_path / "k.cu").write_text(cu)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", f"-std={std}", *NVCC_FLAGS,
                        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert "kf_gemm_fp16x3p_kernel" in r.stderr and spills and set(spills) == {"0"}, r.stderr[-4000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    regions = len({e for e in entries if "kf_gemm_fp16x3p_kernel" in e}) // 2  # 2 and 3 stages
    assert regions == (2 if name.startswith("35") else 1), entries
    # per region: the ieee tile, and the GEMV kernel for 1, 4 and 16 rows x float4 and single-float pieces
    assert len([e for e in entries if "kf_gemm_cuda_core_kernel" in e]) == regions, entries
    gemv = [e for e in entries if "kf_gemv_kernel" in e]
    assert len(gemv) == 6 * regions and all(f"kf_gemv_kernelILi{mt}ELi{v}E" in " ".join(gemv)
                                            for mt in (1, 4, 16) for v in (1, 4)), gemv


@pytest.mark.skipif(shutil.which("nvcc") is None or runtime.cutlass_include() is None,
                    reason="needs nvcc and CUTLASS's headers (scripts/setup installs nvidia-cutlass)")
def test_hopper_gemm_compiles_for_sm90a_without_spills(tmp_path):
    """With -DKF_SM90 (what runtime.build_options adds on an H100), the translation unit of seed 12 also holds
    CUTLASS's warp-specialized kernel on kfuse's split mainloop (hi and lo tiles, hi*hi promoted, the cross products
    apart), the region's epilogue functor in its epilogue, wgmma not serialized by ptxas (C7514: a read of an
    accumulator it cannot match to its wait), and no kernel spills."""
    cu = ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')",
                                    compile_cuda(SEEDS / "12_gemm_multiply_leakyrelu.py").source, re.S).group(1))
    (tmp_path / "k.cu").write_text(cu)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", "-std=c++20", *NVCC_FLAGS, "-DKF_SM90",
                        f"-I{runtime.cutlass_include()}", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
                        "-diag-suppress", "2908"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", r.stderr)
    (hopper,) = [e for e in entries if "GemmUniversal" in e]
    assert "SplitMainloop" in hopper and "KfSm90Epilogue" in hopper and "Epi_linear_mul_leaky_relu" in hopper
    assert "C7514" not in r.stderr, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}, r.stderr[-4000:]


def test_hopper_flags_only_for_an_sm90_gpu_with_the_headers(monkeypatch, tmp_path):
    """The Hopper GEMM is built where the GPU is sm_90 and CUTLASS's headers are found, else the WMMA tile alone
    (and KFUSE_CUDA_SM90=0 keeps the WMMA tile); the flags enter the extension's name."""
    inc = tmp_path / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "cutlass.h").write_text("")
    monkeypatch.setenv("CUTLASS_PATH", str(tmp_path))
    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
    for cap, env, expect in [((9, 0), "1", True), ((8, 0), "1", False), ((9, 0), "0", False), ((10, 0), "1", False)]:
        monkeypatch.setattr(runtime.torch.cuda, "get_device_capability", lambda cap=cap: cap)
        monkeypatch.setenv("KFUSE_CUDA_SM90", env)
        archs, flags = runtime.build_options()
        assert (runtime.sm90_headers() is not None) is expect
        assert ("-DKF_SM90" in flags) is expect
        assert (archs == "9.0a") is expect
        if expect:
            assert f"-I{tmp_path / 'include'}" in flags
    monkeypatch.delenv("CUTLASS_PATH")
    monkeypatch.setattr(runtime.importlib.util, "find_spec", lambda name: None)
    assert runtime.cutlass_include() is None


def _torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return include_paths()


# one Model with a region of every CUDA kind: BatchNorm1d, GroupNorm (43-channel groups), the row sum, a row norm
# (softmax), a pool over the features, the epilogue
EVERY_KIND = ("self.fc1 = nn.Linear(in_features, out_features)\nself.bn = nn.BatchNorm1d(out_features)\n"
              "self.fc2 = nn.Linear(out_features, out_features)\nself.gn = nn.GroupNorm(3, out_features)\n"
              "self.fc3 = nn.Linear(out_features, out_features)\nself.fc4 = nn.Linear(out_features, 40)\n"
              "self.fc5 = nn.Linear(out_features, out_features)\nself.pool = nn.MaxPool1d(4)",
              "y = torch.relu(self.bn(self.fc1(x)))\nz = self.gn(self.fc2(y))\n"
              "w = torch.softmax(self.fc5(z), dim=1)\n"
              "return (self.fc3(z).sum(dim=1, keepdim=True) * 0.5, torch.tanh(self.fc4(w)),\n"
              "        self.pool(self.fc5(z).unsqueeze(1)).squeeze(1))")


def test_every_kind_problem_has_one_region_of_each_kind(tmp_path):
    prob = load_problem(write_problem(tmp_path, *EVERY_KIND, name="every_kind"))
    (v,) = variants(capture_problem(prob, "cpu"), KINDS)
    assert sorted(r.kind for r in v.regions) == ["gemm_batchnorm", "gemm_epilogue", "gemm_groupnorm_wide", "gemm_pool",
                                                "gemm_rowreduce", "gemm_rowsum"] and not v.unfused


def cpp_syntax_errors(emitted: dict, folder: Path) -> str:
    """g++'s errors (empty where none) on a file's C++ translation unit (`emitted`: its emitted_constants, CPP_SRC)
    and the bindings load_inline adds for its CUDA_FUNCTIONS, syntax-checked against this torch's headers (the CUDA
    toolkit's runtime header where installed; a CPU-only torch lacks one generated c10 header, stubbed here)."""
    binds = "\n".join(f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in emitted["CUDA_FUNCTIONS"])
    bindings = "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" + binds + "\n}\n"
    (folder / "main.cpp").write_text(emitted["CPP_SRC"] + bindings)
    stub = folder / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cuda_inc = [f"-isystem{p}" for p in ("/usr/local/cuda/include",) if os.path.isdir(p)]
    if not cuda_inc and not Path("/usr/include/cuda_runtime_api.h").exists():
        pytest.skip("no CUDA runtime header")
    incs = [f"-isystem{p}" for p in _torch_includes()] + cuda_inc + [f"-isystem{sysconfig.get_paths()['include']}"]
    r = subprocess.run(["g++", "-fsyntax-only", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-I",
                        str(folder / "stub"), *incs, "-DTORCH_EXTENSION_NAME=kf_check", "main.cpp"], cwd=folder,
                       capture_output=True, text=True)
    return "" if r.returncode == 0 else r.stderr[-4000:] or f"g++ exit {r.returncode}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_glue_compiles_against_torch_headers(tmp_path):
    """The C++ translation unit of one file with a region of every kind, and its bindings."""
    compiled = compile_cuda(write_problem(tmp_path, *EVERY_KIND, name="every_kind"))
    ns = emitted_constants(compiled.source)
    assert cpp_syntax_errors(ns, tmp_path) == ""


# ---- runtime -----------------------------------------------------------------------------------------------------
def test_extension_name_is_a_content_hash(tmp_path, monkeypatch):
    a = runtime.extension_name("cu", "cpp", ("f",), "id")
    assert a == runtime.extension_name("cu", "cpp", ("f",), "id") and re.fullmatch(r"kfuse_[0-9a-f]{24}", a)
    others = [("cu2", "cpp", ("f",), "id"), ("cu", "cpp2", ("f",), "id"), ("cu", "cpp", ("g",), "id"),
              ("cu", "cpp", ("f",), "id2")]
    assert len({a, *[runtime.extension_name(*o) for o in others]}) == 5
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # a judge's compile cache, in its sandbox
    monkeypatch.delenv("KFUSE_CACHE_DIR", raising=False)
    assert runtime.cache_folder() == str(tmp_path / "ext" / "kfuse_cuda")
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))  # the user's choice first
    assert runtime.cache_folder() == str(tmp_path / "cuda")
    folder = tmp_path / "cuda" / a
    folder.mkdir(parents=True)
    (folder / f"{a}.so").write_bytes(b"")  # a build cut short: no marker, so it is built again
    assert runtime._import_built(a, str(folder)) is None


def test_weight_cache_follows_the_version_counter():
    w = torch.nn.Parameter(torch.randn(5, 3))
    made = []

    def make():
        made.append(1)
        return w.detach().clone()

    first = runtime.cached_on(w, "t", make)
    assert runtime.cached_on(w, "t", make) is first and len(made) == 1
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer step
    assert torch.equal(runtime.cached_on(w, "t", make), w.detach()) and len(made) == 2
    runtime.cached_on(w, "other", make)
    assert len(made) == 3


# ---- autograd through CudaGemmFn, the kernel replaced by torch ---------------------------------------------------
def _detached(outs):
    return tuple(o.detach().clone() for o in outs) if isinstance(outs, tuple) else outs.detach().clone()


def region_fns(module, base: str) -> list[type]:
    """The generated Functions of a ModelNew module deriving from the runtime's `base` (a file carries the base
    only where a region uses it)."""
    cls = getattr(module, base, None)
    return [] if cls is None else [v for k, v in vars(module).items() if k.endswith("Fn") and isinstance(v, type)
                                   and issubclass(v, cls) and v is not cls]


@contextlib.contextmanager
def updating_batch_norms(module):
    """The file's batch_norm_ref, within: a training BatchNorm also updates its running statistics as the kernels do
    (batch_norm_mode's bookkeeping, then torch's update). A file carries batch_norm_ref only where a region has a
    BatchNorm."""
    plain_ref = getattr(module, "batch_norm_ref", None)
    if plain_ref is None:
        yield
        return

    def updating_ref(y, bn, saved, cast):
        if saved is None and bn.training and bn.track_running_stats:
            _, factor = module.batch_norm_mode(bn)
            return torch.nn.functional.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, True,
                                                  factor, bn.eps)
        return plain_ref(y, bn, saved, cast)

    module.batch_norm_ref = updating_ref
    try:
        yield
    finally:
        module.batch_norm_ref = plain_ref


def _torch_launch(module, fn):
    """Fn.launch computed in torch (what the CUDA kernels compute): the epilogue from z, a training BatchNorm
    updating its running statistics (updating_batch_norms)."""

    def launch(self, x, save_z=False):
        w, b = fn.gemm(self)
        z = x @ w if fn.KN else torch.nn.functional.linear(x, w)
        z = (z if b is None else z + b).detach()
        with updating_batch_norms(module), torch.no_grad():
            outs = fn.epilogue(self, fn.state(self), lambda t: t, z)
        outs = outs if isinstance(outs, tuple) else (outs,)
        outs = tuple(o.detach().clone() for o in outs)
        return (outs, z) if save_z else (outs[0] if len(outs) == 1 else outs)

    return staticmethod(launch)


@pytest.mark.parametrize("name,sizes", [
    ("12_gemm_multiply_leakyrelu", SMALL["12_gemm_multiply_leakyrelu"]),
    ("36_matmul_kn_param_tanh_scale", SMALL["12_gemm_multiply_leakyrelu"]),
    ("21_gemm_sigmoid_scaling_residualadd", SMALL["12_gemm_multiply_leakyrelu"]),
    ("04_gemm_divide_sum_scaling", {"batch_size": 37, "in_features": 70, "out_features": 129}),
])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernel(tmp_path, monkeypatch, name, sizes):
    from kfuse.gradients import gradient_contract

    path = SEEDS / f"{name}.py" if (SEEDS / f"{name}.py").exists() else GEMM / f"{name}.py"
    prob = load_problem(path, sizes)
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, sizes).source)
    module = load_module(out)
    fns, recomputed = region_fns(module, "CudaGemmFn"), region_fns(module, "CudaRecomputeFn")
    assert fns or recomputed
    for fn in fns:
        monkeypatch.setattr(fn, "launch", _torch_launch(module, fn))
    for fn in recomputed:  # the region's own torch reference in place of the kernel
        monkeypatch.setattr(fn, "launch", staticmethod(
            lambda self, x, fn=fn: _detached(fn.reference(self, {}, lambda t: t, x.detach()))))
    verdict = gradient_contract(prob, module.ModelNew, device="cpu", draws=2)
    assert verdict.correct, verdict.failures


# ---- the CUDA-core kernels' summation orders, modelled on the CPU -------------------------------------------------
# Exact models of the order in which kf_gemm_cuda_core_kernel (scheme ieee, > 16 rows) and kf_gemv_kernel (<= 16
# rows, any scheme) add, in float64 torch on the CPU: a product of two fp32 values is exact in double, so
# `acc + x * w` here is the kernel's double fma(x, w, acc) bit for bit. The GPU test below compares the kernels
# with these models exactly; the CPU test checks the models against float64 and rule 3.
def tile_model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """kf_gemm_cuda_core_kernel: per output, one double FMA chain over k = 0, 1, ..., K-1, rounded to fp32 once."""
    x64, w64 = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float64)
    for k in range(x.shape[1]):
        acc = acc + x64[:, k, None] * w64[None, :, k]
    return acc.float()


def gemv_model(x: torch.Tensor, w: torch.Tensor, vec: int | None = None) -> torch.Tensor:
    """kf_gemv_kernel: lane l of a warp sums (double FMAs, k increasing) the VEC-wide pieces k = VEC (l + 32 j)
    (VEC 4 where K % 4 == 0 and the rows are 16-byte aligned, else 1; x's staging in chunks of a multiple of 32 VEC
    columns keeps that assignment), then __shfl_xor_sync with offsets 16, 8, 4, 2, 1 adds lane l and l ^ off (a
    pairwise tree: lanes < off end with p[l] + p[l + off]); the total is rounded to fp32 once."""
    m, k = x.shape
    vec = vec or (4 if k % 4 == 0 else 1)
    kp = -(-k // (32 * vec)) * 32 * vec  # zero pieces add exact zeros
    xs = torch.nn.functional.pad(x.double(), (0, kp - k)).reshape(m, kp // (32 * vec), 32, vec)
    ws = torch.nn.functional.pad(w.double(), (0, kp - k)).reshape(w.shape[0], kp // (32 * vec), 32, vec)
    acc = torch.zeros(m, w.shape[0], 32, dtype=torch.float64)
    for j in range(xs.shape[1]):
        for e in range(vec):
            acc = acc + xs[:, None, j, :, e] * ws[None, :, j, :, e]
    for off in (16, 8, 4, 2, 1):
        acc = acc[..., :off] + acc[..., off:2 * off]
    return acc[..., 0].float()


def fp32_sequential_model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The ieee tile before this fix: fp32 FMAs over k = 0..K-1 (each step's exact double sum rounded to fp32; a
    true fmaf differs only where that double rounding lands on a tie, which no statistic here sees)."""
    x64, w64 = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = (acc.double() + x64[:, k, None] * w64[None, :, k]).float()
    return acc


def _seed12_errors(m: int, k: int, n: int, seed: int) -> dict[str, float]:
    """Max |out - float64| of problems/seeds/12 (Linear, * 2, LeakyReLU 0.1; x = rand) at (m, k) -> n with z from
    each model, from torch's CPU fp32 F.linear ("eager_cpu") and from float64 rounded once ("rounded": the most
    accurate fp32 GEMM there can be; cuBLAS on an H100 came close at these sizes, 2.5-2.8e-7)."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n)
    x = torch.rand(m, k)
    w, b = lin.weight.detach(), lin.bias.detach()

    def epilogue(z):
        return torch.nn.functional.leaky_relu(z * 2.0, 0.1)

    ref = epilogue(x.double() @ w.double().t() + b.double())
    zs = {"eager_cpu": torch.nn.functional.linear(x, w, b), "rounded": (x.double() @ w.double().t()).float() + b,
          "tile": tile_model(x, w) + b, "gemv": gemv_model(x, w) + b,
          "fp32_sequential": fp32_sequential_model(x, w) + b}
    return {name: float((epilogue(z).double() - ref).abs().max()) for name, z in zs.items()}


@pytest.mark.parametrize("sizes", [(37, 70, 129), (17, 64, 128), (1, 5, 3), (16, 1000, 257), (3, 515, 130)])
def test_cuda_core_summation_orders_meet_rule_3_against_the_most_accurate_eager(sizes):
    """Rule 3 (error vs float64 <= 2 x eager's + 1e-7) with eager replaced by its best case, float64 rounded once
    (a GEMM as accurate as cuBLAS was on the H100 at these sizes): both CUDA-core orders pass every draw. The ieee
    tile's old order (fp32 sums in k order, torch's CPU order too) fails nearly every draw at the two sizes where
    the H100 run failed it (37 x 70 -> 129: 6.68e-07 against 6.58e-07; 17 x 64 -> 128): this test would have
    caught that."""
    m, k, n = sizes
    draws = [_seed12_errors(m, k, n, seed) for seed in range(6)]
    for e in draws:
        bound = 2 * min(e["rounded"], e["eager_cpu"]) + 1e-7
        assert e["tile"] <= bound and e["gemv"] <= bound, (e, bound)
        assert e["tile"] <= 1.5 * e["rounded"] + 1e-8 and e["gemv"] <= 1.5 * e["rounded"] + 1e-8, e  # ~rounded once
    if (m, k, n) in ((37, 70, 129), (17, 64, 128)):
        old_fails = sum(e["fp32_sequential"] > 2 * e["rounded"] + 1e-7 for e in draws)
        assert old_fails >= len(draws) // 2, draws


def test_gemv_model_adds_every_piece_once():
    """gemv_model's pieces, lanes and tree cover every k exactly once (exact on powers of two), odd K too."""
    k = 32 * 4 * 3 + 8  # three full passes of float4 pieces and a partial one
    x = torch.zeros(1, k)
    w = torch.ones(3, k)
    x[0, 4 * 5 + 2] = 1.0  # lane 5's piece 0
    x[0, 4 * (31 + 32 * 2) + 3] = 2.0 ** 20  # lane 31's piece 2
    assert gemv_model(x, w).tolist() == [[1.0 + 2.0 ** 20] * 3]
    x = torch.rand(4, 99)  # K odd: one float per piece
    w = torch.rand(7, 99)
    assert torch.allclose(gemv_model(x, w).double(), x.double() @ w.double().t(), rtol=1e-6, atol=0)


# ---- the command --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--backend", "cuda", "--device", "cpu"], "--backend cuda: its kernels are CUDA C++"),
    (["--backend", "rocm"], "--backend rocm: expected triton or cuda"),
    (["--backend", "cuda", "--scheme", "tf32x3"], "--scheme tf32x3: expected fp16x3p or ieee with --backend cuda"),
])
def test_cli_backend_errors_are_one_line(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "kfuse.cli", "optimize", str(SEEDS / "12_gemm_multiply_leakyrelu.py"),
                        "-o", str(tmp_path / "out.py"), *args], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_backend_error_is_one_line(monkeypatch):
    """bench checks --backend as optimize does (the GPU check comes first, so a GPU is pretended here)."""
    from typer.testing import CliRunner

    from kfuse.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    r = CliRunner().invoke(app, ["bench", str(SEEDS / "12_gemm_multiply_leakyrelu.py"), "--backend", "rocm"])
    assert r.exit_code == 2 and r.output.strip() == "kfuse: error: --backend rocm: expected triton or cuda", r.output


# ---- GPU ---------------------------------------------------------------------------------------------------------
def _contract(path: Path, overrides: dict, trials: int = 3, scheme: str | None = None):
    from kfuse.verify import check_contract, run_in_process

    prob = load_problem(path, overrides)
    compiled = compile_problem(prob, Options(device="cuda", backend="cuda", scheme=scheme))
    assert compiled.fallback is None
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"kfuse_cuda_{path.stem}_{os.getpid()}.py"
    out.write_text(compiled.source)
    module = load_module(out)
    return prob, module, check_contract(prob, run_in_process(module.ModelNew), device="cuda", trials=trials)


def _both_contracts(path: Path) -> None:
    """The accuracy contract and the gradient contract (two draws) of a problem's CUDA ModelNew, on the GPU."""
    from kfuse.gradients import gradient_contract

    prob, module, contract = _contract(path, {})
    assert contract.correct, contract.failures
    verdict = gradient_contract(prob, module.ModelNew, device="cuda", draws=2)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("path", sorted(SEEDS.glob("*.py")), ids=lambda p: p.stem)
def test_gpu_seeds_meet_the_contract(path):
    _, _, contract = _contract(path, {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("scheme", ["fp16x3p", "ieee"])
@pytest.mark.parametrize("sizes", [(37, 70, 129), (130, 97, 300), (1, 5, 3), (300, 1000, 999), (1037, 700, 1029),
                                   (17, 64, 128), (16, 1001, 70), (3, 4096, 515)])
def test_gpu_odd_sizes_meet_the_contract(scheme, sizes):
    """Edges in M, N and K (K not a multiple of 32, N of 128), the GEMV kernel at <= 16 rows, both schemes (the
    tensor-core tiles past runtime.CUDA_CORE_MNK multiply-adds: 300 x 1000 -> 999 and 1037 x 700 -> 1029)."""
    m, k, n = sizes
    _, _, contract = _contract(SEEDS / "12_gemm_multiply_leakyrelu.py",
                               {"batch_size": m, "in_features": k, "out_features": n}, scheme=scheme)
    assert contract.correct, contract.failures


def _region_fn(module):
    """The generated file's one CudaGemmFn subclass."""
    (fn,) = region_fns(module, "CudaGemmFn")
    return fn


def _built_on_gpu(path: Path, overrides: dict, scheme: str | None = None):
    """(problem, the generated module, ModelNew on the GPU under seed 0)."""
    prob = load_problem(path, overrides)
    compiled = compile_problem(prob, Options(device="cuda", backend="cuda", scheme=scheme))
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"kfuse_cuda_{path.stem}_{os.getpid()}_{scheme}.py"
    out.write_text(compiled.source)
    module = load_module(out)
    torch.manual_seed(0)
    return prob, module, prob.build(cls=module.ModelNew, device="cuda")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("scheme", ["fp16x3p", "ieee"])
@pytest.mark.parametrize("sizes", [(1, 5, 3), (1, 8192, 1000), (3, 515, 257), (4, 1000, 130), (9, 64, 33),
                                   (16, 1000, 999), (16, 1001, 70), (1, 64, 40, "misaligned"), (17, 64, 128),
                                   (37, 70, 129)])
def test_gpu_cuda_core_kernels_are_their_cpu_model_bit_for_bit(scheme, sizes):
    """z = x W^T + b from the kernel equals the CPU model of its order exactly: kf_gemv_kernel for <= 16 rows (any
    scheme; float4 and single-float pieces, several x chunks, padded rows, an x 4 bytes off 16-byte alignment),
    kf_gemm_cuda_core_kernel for more rows under ieee. The models meet rule 3 (the CPU test above), so this proves
    the kernels do."""
    m, k, n, *misaligned = sizes
    if scheme == "fp16x3p" and m > gemm_source.SKINNY_M:
        pytest.skip("the split WMMA tile: no CPU model (the contract tests cover it)")
    _, module, model = _built_on_gpu(SEEDS / "12_gemm_multiply_leakyrelu.py",
                                     {"batch_size": m, "in_features": k, "out_features": n}, scheme)
    x = torch.rand(m * k + 1, device="cuda")[1:].view(m, k) if misaligned else torch.rand(m, k, device="cuda")
    with torch.no_grad():
        outs, z = _region_fn(module).launch(model, x, save_z=True)
    w, b = model.gemm.weight.detach().cpu(), model.gemm.bias.detach().cpu()
    xc = x.cpu()
    want = (gemv_model(xc, w, vec=1 if misaligned else None) if m <= gemm_source.SKINNY_M else tile_model(xc, w)) + b
    assert torch.equal(z.cpu(), want), float((z.cpu() - want).abs().max())
    assert torch.allclose(outs[0].cpu(), torch.nn.functional.leaky_relu(want * 2.0, 0.1), rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
@requires_cuda
def test_gpu_gemv_reads_the_weight_at_memory_speed():
    """problems/gemm/37 (1 x 8192 -> 8192, softplus, hardswish): the region's launcher, back to back, under 0.3 ms
    a call (predicted ~0.095 ms: W's 268 MB read once at ~3 TB/s; the float64 64 x 64 tile it replaces took 1.65
    ms, eager 0.13). Lenient: gpu_check.sh runs this beside other GPU work; gemv_time.py gives the clean figure."""
    _, module, model = _built_on_gpu(GEMM / "37_gemm_softplus_hardswish_batch1.py", {})
    fn = _region_fn(module)
    x = torch.rand(1, 8192, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            fn.launch(model, x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            fn.launch(model, x)
        end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / 20
    assert ms < 0.3, ms


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["36_matmul_kn_param_tanh_scale", "35_mlp_linear_relu_linear",
                                  "37_gemm_softplus_hardswish_batch1", "29_matmul_add_swish_tanh_gelu_hardtanh",
                                  "04_gemm_divide_sum_scaling"])
def test_gpu_gemm_problems_meet_the_contract(name):
    _, _, contract = _contract(GEMM / f"{name}.py", {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name,sizes", [("12_gemm_multiply_leakyrelu", SMALL["12_gemm_multiply_leakyrelu"]),
                                        ("36_matmul_kn_param_tanh_scale", SMALL["12_gemm_multiply_leakyrelu"]),
                                        ("04_gemm_divide_sum_scaling", SMALL["12_gemm_multiply_leakyrelu"])])
def test_gpu_gradients_meet_the_contract(name, sizes):
    from kfuse.gradients import gradient_contract

    path = SEEDS / f"{name}.py" if (SEEDS / f"{name}.py").exists() else GEMM / f"{name}.py"
    prob, module, contract = _contract(path, sizes, trials=1)
    verdict = gradient_contract(prob, module.ModelNew, device="cuda", draws=2)
    assert verdict.correct, verdict.failures


@pytest.mark.gpu
@requires_cuda
def test_gpu_second_process_loads_the_built_extension_fast(tmp_path):
    prob, module, _ = _contract(SEEDS / "12_gemm_multiply_leakyrelu.py", SMALL["12_gemm_multiply_leakyrelu"], trials=1)
    module.cuda_module()  # built (or loaded) here
    script = ("import importlib.util, sys, time\nspec = importlib.util.spec_from_file_location('m', sys.argv[1])\n"
              "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\nimport torch\n"
              "torch.cuda.init()\nt = time.perf_counter()\nm.cuda_module()\nprint(time.perf_counter() - t)\n")
    r = subprocess.run([sys.executable, "-c", script, module.__file__], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seconds = float(r.stdout.strip().splitlines()[-1])
    assert seconds < 1.0 and math.isfinite(seconds), seconds

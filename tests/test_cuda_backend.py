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
from kfuse_testing import ROOT, SEEDS, SMALL, requires_cuda

GEMM = ROOT / "problems" / "gemm"
# problems/gemm files whose emitted files are checked: two regions, x @ W (K, N), a batch of 1, every activation
GEMM_SAMPLE = ["02_gemm_gelu_tanh_scale", "06_matmul_scale_residual_clamp_logsumexp_mish", "07_matmul_mish_mish",
               "13_gemm_scaling_hardtanh_gelu", "24_gemm_swish_divide_clamp_tanh_clamp",
               "29_matmul_add_swish_tanh_gelu_hardtanh", "35_mlp_linear_relu_linear", "36_matmul_kn_param_tanh_scale",
               "37_gemm_softplus_hardswish_batch1", "19_matmul_dropout_mean_softmax"]
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
def test_cuda_partition_keeps_the_gemm_and_says_why_the_rest_is_torch():
    prob = load_problem(SEEDS / "62_matmul_groupnorm_leakyrelu_sum.py", SMALL["62_matmul_groupnorm_leakyrelu_sum"])
    (v,) = variants(capture_problem(prob, "cpu"), KINDS)
    assert [r.kind for r in v.regions if r.fused] == ["gemm_epilogue"]
    assert [n.op for n in v.regions[0].nodes] == ["linear"]
    reasons = unfused_reasons(v)
    assert set(reasons) == set(v.unfused) and v.unfused
    assert "gemm_groupnorm" in reasons["nn.GroupNorm gn"] and "no CUDA version" in reasons["nn.GroupNorm gn"]


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


def check_emitted(source: str) -> None:
    tree = ast.parse(source)
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("triton" in m for m in imported), imported
    ns: dict = {}
    for node in tree.body:  # the module-level constants, without running the file
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in (
                "CUDA_SRC", "CPP_SRC", "CUDA_FUNCTIONS"):
            ns[node.targets[0].id] = ast.literal_eval(node.value)
    cu, cpp, functions = ns["CUDA_SRC"], ns["CPP_SRC"], ns["CUDA_FUNCTIONS"]
    assert _balanced(cu) and _balanced(cpp)
    assert "#include <torch" not in cu  # the CUDA file builds without torch's headers
    for f in functions:  # every bound function is defined in the C++ source
        assert re.search(rf"std::vector<torch::Tensor> {f}\(", cpp), f
    called = set(re.findall(r"\bext\.(\w+)\(", source))
    assert called and called <= set(functions), called - set(functions)
    for launcher in set(re.findall(r"\b(kf_launch_\w+)\(", cpp)):  # declared and called there, defined here
        assert re.search(rf"^int {launcher}\(.*\) \{{$", cu, flags=re.M), launcher
    globals_ = set(re.findall(r"__global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(", cu))
    for kernel in re.findall(r"(\w+)(?:<[^<>;]*>)?<<<", cu):  # every launched kernel is defined
        assert kernel in globals_ or re.search(rf"auto {kernel} = (\w+)<", cu), kernel
    for struct in re.findall(r"\b(Epi_\w+) epi;", cu):
        assert re.search(rf"^struct {struct} \{{", cu, flags=re.M), struct
    classes = re.findall(r"^class (\w+Fn)\(CudaGemmFn\):", source, flags=re.M)
    model_new = source[source.index("class ModelNew(Model):"):]
    assert classes and all(f"{c}.run(self, " in model_new for c in classes)


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


def test_header_names_the_unfused_ops_and_why():
    source = compile_cuda(SEEDS / "39_gemm_scale_batchnorm.py", SMALL["39_gemm_scale_batchnorm"]).source
    head = source.split("\n\n")[0]
    assert "gemm_epilogue: nn.Linear gemm -> operator.mul" in head
    assert "nn.BatchNorm1d bn (--backend triton fuses it in a gemm_batchnorm region" in head.replace("\n#     ", " ")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("name,arch,std", [("35_mlp_linear_relu_linear", "90", "c++20"),
                                           ("36_matmul_kn_param_tanh_scale", "80", "c++17")])
def test_cuda_source_compiles_without_spills(tmp_path, name, arch, std):
    """Two regions in one translation unit (problems/gemm/35) and x @ W with a parameter epilogue (36): nvcc builds
    them for H100 and A100 (C++20, as torch >= 2.10 builds, and C++17), and no kernel spills registers (the GEMM
    tile keeps two 64 x 32 fp32 accumulators per warp)."""
    cu = ast.literal_eval(re.search(r"CUDA_SRC = (r\'\'\'.*?\'\'\')", compile_cuda(GEMM / f"{name}.py").source,
                                    re.S).group(1))
    (tmp_path / "k.cu").write_text(cu)
    r = subprocess.run(["nvcc", "-c", "k.cu", "-o", "k.o", f"-std={std}", *NVCC_FLAGS,
                        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert "kf_gemm_fp16x3p_kernel" in r.stderr and spills and set(spills) == {"0"}, r.stderr[-4000:]


def _torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return include_paths()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_glue_compiles_against_torch_headers(tmp_path):
    """The C++ translation unit and the bindings load_inline adds, syntax-checked by g++ against this torch's
    headers (the CUDA toolkit's runtime header where installed; a CPU-only torch lacks one generated c10 header,
    stubbed here)."""
    compiled = compile_cuda(GEMM / "36_matmul_kn_param_tanh_scale.py")
    ns = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(compiled.source).body
          if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and n.targets[0].id in
          ("CPP_SRC", "CUDA_FUNCTIONS")}
    binds = "\n".join(f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in ns["CUDA_FUNCTIONS"])
    (tmp_path / "main.cpp").write_text(ns["CPP_SRC"] + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" + binds
                                       + "\n}\n")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cuda_inc = [f"-isystem{p}" for p in ("/usr/local/cuda/include",) if os.path.isdir(p)]
    if not cuda_inc and not Path("/usr/include/cuda_runtime_api.h").exists():
        pytest.skip("no CUDA runtime header")
    incs = [f"-isystem{p}" for p in _torch_includes()] + cuda_inc + [f"-isystem{sysconfig.get_paths()['include']}"]
    r = subprocess.run(["g++", "-fsyntax-only", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-I",
                        str(tmp_path / "stub"), *incs, "-DTORCH_EXTENSION_NAME=kf_check", "main.cpp"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


# ---- runtime -----------------------------------------------------------------------------------------------------
def test_extension_name_is_a_content_hash(tmp_path, monkeypatch):
    a = runtime.extension_name("cu", "cpp", ("f",), "id")
    assert a == runtime.extension_name("cu", "cpp", ("f",), "id") and re.fullmatch(r"kfuse_[0-9a-f]{24}", a)
    others = [("cu2", "cpp", ("f",), "id"), ("cu", "cpp2", ("f",), "id"), ("cu", "cpp", ("g",), "id"),
              ("cu", "cpp", ("f",), "id2")]
    assert len({a, *[runtime.extension_name(*o) for o in others]}) == 5
    monkeypatch.setenv("KFUSE_CACHE_DIR", str(tmp_path))
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
def _torch_launch(fn):
    """Fn.launch computed in torch (what the CUDA kernel computes): the outputs, and z with save_z."""
    def launch(self, x, save_z=False):
        w, b = fn.gemm(self)
        z = x @ w if fn.KN else torch.nn.functional.linear(x, w)
        if b is not None:
            z = z + b
        z = z.detach()
        outs = fn.epilogue(self, lambda t: t, z)
        outs = outs if isinstance(outs, tuple) else (outs,)
        outs = tuple(o.detach().clone() for o in outs)
        return (outs, z) if save_z else (outs[0] if len(outs) == 1 else outs)
    return staticmethod(launch)


@pytest.mark.parametrize("name,sizes", [
    ("12_gemm_multiply_leakyrelu", SMALL["12_gemm_multiply_leakyrelu"]),
    ("39_gemm_scale_batchnorm", SMALL["39_gemm_scale_batchnorm"]),
    ("36_matmul_kn_param_tanh_scale", SMALL["12_gemm_multiply_leakyrelu"]),
    ("21_gemm_sigmoid_scaling_residualadd", SMALL["12_gemm_multiply_leakyrelu"]),
])
def test_backward_meets_the_gradient_contract_with_torch_in_place_of_the_kernel(tmp_path, monkeypatch, name, sizes):
    from kfuse.gradients import gradient_contract

    path = SEEDS / f"{name}.py" if (SEEDS / f"{name}.py").exists() else GEMM / f"{name}.py"
    prob = load_problem(path, sizes)
    out = tmp_path / "new.py"
    out.write_text(compile_cuda(path, sizes).source)
    module = load_module(out)
    fns = [v for k, v in vars(module).items() if k.endswith("Fn") and isinstance(v, type)
           and issubclass(v, module.CudaGemmFn) and v is not module.CudaGemmFn]
    assert fns
    for fn in fns:
        monkeypatch.setattr(fn, "launch", _torch_launch(fn))
    verdict = gradient_contract(prob, module.ModelNew, device="cpu", draws=2)
    assert verdict.correct, verdict.failures


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


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("path", sorted(SEEDS.glob("*.py")), ids=lambda p: p.stem)
def test_gpu_seeds_meet_the_contract(path):
    _, _, contract = _contract(path, {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("scheme", ["fp16x3p", "ieee"])
@pytest.mark.parametrize("sizes", [(37, 70, 129), (130, 97, 300), (1, 5, 3), (300, 1000, 999), (17, 64, 128)])
def test_gpu_odd_sizes_meet_the_contract(scheme, sizes):
    """Edges in M, N and K (K not a multiple of 32, N of 128), the skinny float64 path at 1 row, both schemes."""
    m, k, n = sizes
    _, _, contract = _contract(SEEDS / "12_gemm_multiply_leakyrelu.py",
                               {"batch_size": m, "in_features": k, "out_features": n}, scheme=scheme)
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", ["36_matmul_kn_param_tanh_scale", "35_mlp_linear_relu_linear",
                                  "37_gemm_softplus_hardswish_batch1", "29_matmul_add_swish_tanh_gelu_hardtanh"])
def test_gpu_gemm_problems_meet_the_contract(name):
    _, _, contract = _contract(GEMM / f"{name}.py", {})
    assert contract.correct, contract.failures


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name,sizes", [("12_gemm_multiply_leakyrelu", SMALL["12_gemm_multiply_leakyrelu"]),
                                        ("36_matmul_kn_param_tanh_scale", SMALL["12_gemm_multiply_leakyrelu"])])
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

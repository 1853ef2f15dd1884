#!/usr/bin/env bash
# GPU check of the transposed convolutions (kernels/conv_transpose.py), from the repository root on an H100 / H200:
#   benchmarks/conv/gpu_transposed.sh [OUT]          (default OUT: benchmarks/conv/gpu-transposed)
# 1. the compiled (TRITON_INTERPRET=0) kernel against float64 torch at odd sizes, every scheme, on the GPU;
# 2. `kfuse bench` at full size on five KernelBench transposed convolutions (eager as users run it beside kfuse;
#    torch.compile left out to stay under 8 minutes), each under its own time limit (120 s + 5 x 70 s in all).
# Prints, per problem, whether kfuse's ModelNew met the contract, its time and eager's, and the ratio
# (OUT/transposed.json, .log, .png); the first lines of the log name the GPU, the versions and the commit.
set -uo pipefail
out="${1:-benchmarks/conv/gpu-transposed}"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1 KFUSE_CACHE_DIR="$PWD/.kfuse-cache" TRITON_INTERPRET=0
export TORCHINDUCTOR_CACHE_DIR="$PWD/.kfuse-cache/inductor"
mkdir -p "$out" "$TORCHINDUCTOR_CACHE_DIR"
kb="${KB:-../shared/kernelbench}"  # KernelBench's files: KB, else ../shared/kernelbench, shared/kernelbench or kb/
for d in shared/kernelbench kb; do [ -d "$kb" ] || kb=$d; done
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    git rev-parse HEAD 2>/dev/null || true

    echo "== 1. compiled kernel vs float64 at odd sizes (every case of tests/test_conv_transpose_kernel.py)"
    timeout 120 python3 - <<'EOF'
import sys
import torch
sys.path.insert(0, "tests")
from test_conv_transpose_kernel import CASES, _inputs  # noqa: E402
from kfuse.kernels import conv_transpose as ct  # noqa: E402
from kfuse.kernels.conv import ConvConfig  # noqa: E402

bad = 0
for cfg in (None, ConvConfig(32, 16, 16, 4, 2)):  # the GPU default tile, and a small one that straddles the cases
    for scheme in ("fp16x3p", "tf32x3", "ieee"):
        for case, (xs, ws, *geo) in CASES.items():
            x, w, b = (t.cuda() if t is not None else None for t in _inputs(xs, ws, geo[3], 0))
            ref = ct.conv_transpose_ref(x.double(), w.double(), b.double(), *geo)
            with torch.backends.cudnn.flags(allow_tf32=False):
                eager = ct.conv_transpose_ref(x, w, b, *geo)
            out = ct.conv_transpose_forward(x, w, b, *geo, scheme=scheme, cfg=cfg)
            err = (out.double() - ref).abs().max().item()
            e_err = (eager.double() - ref).abs().max().item()
            ok = out.shape == ref.shape and err <= 2 * e_err + 1e-6
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {scheme:8} {str(cfg and 'small'):5} {case:30} err {err:.2e} eager {e_err:.2e}")
print("compiled kernel:", "all ok" if not bad else f"{bad} BAD")
EOF

    echo "== 2. kfuse bench, full size"
    for f in level2/2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py \
             level2/16_ConvTranspose2d_Mish_Add_Hardtanh_Scaling.py \
             level1/75_conv_transposed_2D_asymmetric_input_asymmetric_kernel_strided__grouped____padded____dilated__.py \
             level1/77_conv_transposed_3D_square_input_square_kernel___padded____dilated____strided__.py \
             level1/81_conv_transposed_2D_asymmetric_input_square_kernel___dilated____padded____strided__.py; do
        n=$(basename "$f" .py)
        timeout 70 python3 -m kfuse bench "$kb/$f" --baselines eager --trials 3 --json "$out/$n.json" \
            || echo "$n: exit $? (124: over its 70 s)"
    done
    python3 - "$out" <<'EOF'
import json, pathlib, sys
print(f"{'problem':60} {'correct':>7} {'kfuse ms':>9} {'eager ms':>9} {'eager/kfuse':>11}")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for r in json.loads(p.read_text()).get("results", []):
        k, e = r.get("kfuse_ms"), r.get("eager_ms")
        ratio = f"{e / k:.2f}x" if k and e else "-"
        print(f"{r['problem'][:60]:60} {str(r['correct']):>7} {k or '-':>9} {e or '-':>9} {ratio:>11}")
EOF
} 2>&1 | tee "$out/transposed.log"

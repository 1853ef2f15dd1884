"""Run-time helpers every generated ModelNew carries (a generated file copies the definitions its code reads).

The GEMM policy at run time: the settings the environment gives (read once), the scheme each GEMM runs (scheme_for:
the one decision, which `kfuse optimize` makes for the file too), its tile config (the default, or the autotuner's
choice: TUNER, one object holding every choice made in this process), and the operands (the fp16x3p scheme needs
fp16 hi/lo parts of the weight, cached until the weight changes). Also the small jit math helpers the epilogue
table uses (tanh, softplus).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
import triton
import triton.language as tl

from kfuse.kernels.gemm_core import (
    DEFAULT_SCHEME,
    SKINNY_M,
    SPLIT_SCHEMES,
    USER_SCHEMES,
    GemmConfig,
    _num_sms,
    cdiv,
    default_config,
    ensure_tma_allocator,
    padded_k,
    row_scales,
    sm90_configs,
    sm90_maxnreg,
    split_transposed,
    split_weight,
    split_x,
    supports,
    unit_row_stride,
    valid_configs,
)
from kfuse.kernels.gemm_sm90 import HAVE_GLUON
from kfuse.kernels.long_k import split_k_inputs, split_k_partials, split_k_partials_kernel  # noqa: F401 (tests)
from kfuse.kernels.skinny import fp64_partials

# The file's GEMM scheme on a GPU: "fp16x3p" (fp16 hi/lo split, three products per K block promoted into an fp32
# accumulator), "tf32x3" (Triton's three-pass tf32) or "ieee" (plain fp32 FMA). A generated file defines its own,
# the one `kfuse optimize` chose (scheme_for).
GEMM_SCHEME = "fp16x3p"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the environment says, read once when the module loads (Settings.from_env):
      interpret    TRITON_INTERPRET=1: kernels run in Triton's CPU interpreter (Triton reads it once, at import)
      autotune     KFUSE_AUTOTUNE: "on" (default), "off" (0, off, false: every GEMM runs its default config) or
                   "force" (tune again, ignoring the disk cache); the tuner's mode starts here (TUNER.mode)
      cache_dir    KFUSE_CACHE_DIR (default $XDG_CACHE_HOME/kfuse or ~/.cache/kfuse): autotune.json's folder
      cuda_graphs  KFUSE_CUDA_GRAPHS=0: no CUDA graph replay of repeated inference calls (kernels/graphs.py)"""
    interpret: bool = False
    autotune: str = "on"
    cache_dir: str = ""
    cuda_graphs: bool = True

    @classmethod
    def from_env(cls, env=None) -> "Settings":
        env, cache = os.environ if env is None else env, os.path.expanduser("~/.cache")
        mode = env.get("KFUSE_AUTOTUNE", "1").lower()
        return cls(interpret=env.get("TRITON_INTERPRET") == "1",
                   autotune="off" if mode in ("0", "off", "false") else "force" if mode == "force" else "on",
                   cache_dir=env.get("KFUSE_CACHE_DIR") or os.path.join(env.get("XDG_CACHE_HOME") or cache, "kfuse"),
                   cuda_graphs=env.get("KFUSE_CUDA_GRAPHS", "1") != "0")


SETTINGS = Settings.from_env()


def interpreting() -> bool:
    return SETTINGS.interpret


def cuda_graphs_on() -> bool:
    """May repeated inference calls replay a CUDA graph (kernels/graphs.py)? Not in the interpreter."""
    return SETTINGS.cuda_graphs and not SETTINGS.interpret


def sm90_ok(t: torch.Tensor) -> bool:
    """Can the Hopper twin (kernels/gemm_sm90.py) run for tensors on t's device: Triton with Gluon, a compiled (not
    interpreted) run, and a Hopper GPU (wgmma is sm_90 only: Blackwell has other tensor-core instructions)."""
    return HAVE_GLUON and t.is_cuda and not SETTINGS.interpret and torch.cuda.get_device_capability(t.device)[0] == 9


# ----------------------------------------------------------------------------------------------------------------
# the scheme: one decision
# ----------------------------------------------------------------------------------------------------------------
def scheme_for(requested: str | None, compiled: bool, M: int | None = None) -> str:
    """The GEMM scheme, decided in one place for `kfuse optimize` (M None: the file's scheme, GEMM_SCHEME) and for
    each GEMM at run time (M its rows: gemm_scheme).
      requested: `--scheme` (fp16x3p, tf32x3 or ieee; None: fp16x3p on a GPU, ieee for a file made on the CPU);
      compiled: kernels compiled for a CUDA GPU (False: Triton's CPU interpreter, which runs "ieee").
    Skinny GEMMs (M <= SKINNY_M, e.g. a batch of 1) run "fp64" on a GPU whatever was requested (except "ieee"),
    and in the interpreter too (an fp32 sum's rounding at a batch of 1 was a coin toss against eager's under
    rule 3: tests/test_property.py). Long K is no scheme of its own: fp16x3p's split-K configs (long_k_configs)
    sum their slices in float64, which the region's tile runs as SCHEME "fp64" (tile_scheme)."""
    if requested is not None and requested not in USER_SCHEMES:
        raise ValueError(f"GEMM scheme {requested!r}: expected one of {', '.join(USER_SCHEMES)}")
    if M is None:
        return requested or (DEFAULT_SCHEME if compiled else "ieee")
    skinny = M <= SKINNY_M
    if not compiled:
        return "fp64" if skinny else "ieee"
    scheme = requested or DEFAULT_SCHEME
    return "fp64" if skinny and scheme != "ieee" else scheme


def gemm_scheme(x: torch.Tensor) -> str:
    """The scheme of the GEMM of x (M, K) in this file (scheme_for, GEMM_SCHEME)."""
    return scheme_for(GEMM_SCHEME, x.is_cuda and not SETTINGS.interpret, x.shape[0] if x.dim() == 2 else None)


def tile_scheme(scheme: str, cfg: GemmConfig) -> str:
    """The SCHEME a region's own tile runs: "fp64" (add the float64 sum of K-slice partials) for split-K configs."""
    return "fp64" if cfg.k_slices else scheme


# ----------------------------------------------------------------------------------------------------------------
# the tile config: the default, or the autotuner's choice
# ----------------------------------------------------------------------------------------------------------------
def widened(cfg: GemmConfig, min_block_n: int) -> GemmConfig:
    """cfg with column tiles of at least min_block_n (everything else kept)."""
    return cfg if cfg.block_n >= min_block_n else dataclasses.replace(cfg, block_n=min_block_n)


def gemm_config(M: int, N: int, K: int, scheme: str, min_block_n: int = 16, batch: int = 1,
                kernel=None) -> GemmConfig:
    """The untuned tile config of one GEMM (M rows per product): default_config with column tiles of at least
    min_block_n (the epilogue needs whole groups of that many columns), without split-K for batched products
    (`batch` > 1), or the config TUNER.force set. `kernel`: the launch's kernel, to record the choice for
    chosen_configs (a launcher that never tunes passes it)."""
    cfg = TUNER.forced
    if cfg is None:
        cfg = widened(default_config(M, N, K, scheme, SETTINGS.interpret), min_block_n)
        if batch > 1 and cfg.k_slices:
            cfg = dataclasses.replace(cfg, k_slices=0)
    if kernel is not None:
        key = (kernel, M * batch, N, K, None, None, scheme, min_block_n, batch)
        TUNER.configs[key] = cfg
        TUNER.sources[key] = "default" if TUNER.forced is None else "forced"
    return cfg


def tune_candidates(M: int, N: int, K: int, scheme: str, min_block_n: int, sm90: bool = False,
                    batch: int = 1) -> list:
    """The configs the tuner times for one GEMM (M rows per product): the default first, then the Triton tile's
    and (sm90: sm90_ok) the Hopper twin's, each where the kernel supports it (gemm_core.supports). Split-K configs
    get their tile kernel widened to min_block_n (it only adds partials: any width is cheap)."""
    space = [gemm_config(M, N, K, scheme, min_block_n)] + [widened(c, min_block_n) if c.k_slices else c
                                                           for c in valid_configs(M, N, K, scheme)
                                                           + sm90_configs(M, N, K, scheme)]
    out = []
    for c in space:
        if c not in out and supports(c, scheme, K, min_block_n, batch, sm90):
            out.append(c)
    return out or [gemm_config(M, N, K, scheme, min_block_n, batch)]


def _kernel_name(kernel) -> str:
    return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "kernel")


def _kernel_hash(kernel) -> str:
    import hashlib
    try:
        text = str(kernel.cache_key)  # the kernel's source and the sources of the jit functions it calls
    except Exception:  # noqa: BLE001
        text = str(getattr(kernel, "src", "")) or repr(kernel)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _time_launches(launch, candidates: list, reps: int) -> tuple[dict, list[str]]:
    """({config: median ms of `reps` calls of launch(config)}, [why each config that failed to run failed]).
    One untimed call each first (compilation), then `reps` rounds in which every config runs once, in turn: the
    H100's clock falls within seconds under three fp16 products (1980 -> ~1785 MHz), so configs timed one after the
    other favoured the first (39's persistent twin, timed last, measured 3.19 ms against the one-tile twin's 2.63,
    the reverse of their interleaved order: benchmarks/gemm/NOTES.md, the fair tuner)."""
    live, failed = [], []
    for c in candidates:
        try:
            launch(c)
            torch.cuda.synchronize()
            live.append(c)
        except Exception as err:  # noqa: BLE001 - a config the GPU cannot run (shared memory, registers) is skipped
            failed.append(f"{c.short()}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            torch.cuda.synchronize()
    events = {c: [] for c in live}
    for _ in range(reps):
        for c in live:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(c)
            end.record()
            events[c].append((start, end))
    torch.cuda.synchronize()
    timings = {}
    for c, pairs in events.items():
        times = sorted(start.elapsed_time(end) for start, end in pairs)
        timings[c] = times[len(times) // 2]
    return timings, failed


class Tuner:
    """Every GEMM tile config chosen in this process (DESIGN.md: config space per region kind, disk cache keyed by
    shape/dtype/source hash). The first call of a GEMM kernel at a new (kernel, M, N, K, dtype, device, scheme,
    min_block_n, batch) decides its config: on a GPU with `mode` "on", the fastest of tune_candidates, timed here
    and kept in memory and in `cache_path` (keyed also by the GPU's name and a hash of the kernel's source with the
    jit functions it calls), or read back from there; "force" times them again whatever the disk says; "off", the
    interpreter and CPU tensors take the default config (gemm_config). Later calls look it up (configs)."""

    def __init__(self, settings: Settings):
        self.mode = settings.autotune
        self.cache_path = os.path.join(settings.cache_dir, "autotune.json")
        self.configs = {}  # (kernel, M, N, K, dtype, device, scheme, min_block_n, batch) -> config: per-call lookup
        self.sources = {}  # the same keys -> "default", "tuned", "disk" or "forced"
        self.tuned = {}  # disk-cache key -> config, for the keys tuned or read back in this process
        self.log = []  # one entry per tuning decision (kfuse bench reports them)
        self.forced = None

    def force(self, cfg: GemmConfig | None) -> None:
        """Every GEMM runs `cfg` from now on, untuned (benchmarks and tests; None: back to choosing)."""
        self.forced = cfg
        self.forget()

    def forget(self) -> None:
        """Choose again at every key (the disk cache stays)."""
        self.configs.clear()
        self.sources.clear()
        self.tuned.clear()

    def choose(self, key: tuple, x2: torch.Tensor, N: int, launch) -> GemmConfig:
        """The config of a key seen for the first time (see the class docstring); launch(cfg) runs the GEMM."""
        kernel, M, _, K, _, _, scheme, min_block_n, batch = key
        if self.forced is not None:
            cfg, source = self.forced, "forced"
        elif not x2.is_cuda or SETTINGS.interpret or self.mode == "off":
            cfg, source = gemm_config(M // batch, N, K, scheme, min_block_n, batch), "default"
        else:
            cfg, source = self._tune(kernel, x2, N, scheme, min_block_n, launch, batch)
        self.configs[key] = cfg
        self.sources[key] = source
        return cfg

    def _tune(self, kernel, x2: torch.Tensor, N: int, scheme: str, min_block_n: int, launch, batch: int) -> tuple:
        M, K = x2.shape
        key = "|".join([torch.cuda.get_device_name(x2.device), _kernel_name(kernel), _kernel_hash(kernel),
                        f"{M}x{N}x{K}" + (f"x{batch}" if batch > 1 else ""),
                        str(x2.dtype).replace("torch.", ""), scheme, f"bn>={min_block_n}"])
        candidates = tune_candidates(M // batch, N, K, scheme, min_block_n, sm90_ok(x2), batch)
        return self._pick(key, candidates, launch, lambda d: GemmConfig(**d))

    def _pick(self, key: str, candidates: list, launch, make) -> tuple:
        """(config, "tuned" or "disk") for a disk-cache key: known, cached, else timed (conv.py's tuned_conv too)."""
        if key in self.tuned:
            return self.tuned[key], "tuned"
        t0 = time.perf_counter()
        entry = None if self.mode == "force" else self._read_cache().get(key)
        if entry is not None:
            try:
                cfg = make(entry["config"])
            except (TypeError, KeyError):
                cfg = None
            if cfg in candidates:
                self.tuned[key] = cfg
                self.log.append({"key": key, "config": cfg.short(), "seconds": time.perf_counter() - t0,
                                 "from_disk": True, "timings_ms": entry.get("timings_ms", {})})
                return cfg, "disk"
        timings, failed = _time_launches(launch, candidates, reps=10)
        if not timings:
            raise RuntimeError(f"kfuse autotune: no config ran for {key} ({'; '.join(failed)[:600]})")
        cfg = min(timings, key=timings.get)
        self.tuned[key] = cfg
        seconds = time.perf_counter() - t0
        ms = {c.short(): round(t, 4) for c, t in timings.items()}
        self.log.append({"key": key, "config": cfg.short(), "seconds": seconds, "from_disk": False, "timings_ms": ms})
        self._write_cache(key, {"config": dataclasses.asdict(cfg), "timings_ms": ms, "seconds": round(seconds, 3)})
        return cfg, "tuned"

    def _read_cache(self) -> dict:
        import json
        try:
            with open(self.cache_path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_cache(self, key: str, entry: dict) -> None:
        import json
        try:
            os.makedirs(os.path.dirname(self.cache_path), exist_ok=True)
            data = self._read_cache()
            data[key] = entry
            tmp = f"{self.cache_path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.cache_path)  # atomic: a concurrent reader sees the old or the new file, never half
        except OSError:
            pass  # a read-only home only costs re-tuning next time

    def chosen_configs(self) -> list[dict]:
        """Every GEMM config chosen in this process, as JSON rows (the report's gemm_configs): kernel, shape
        [M, N, K] (M rows per product), batch, dtype, scheme, config (its fields), name (GemmConfig.short) and
        source ("default", "tuned", "disk" or "forced"), one row per distinct GEMM."""
        rows = []
        for key, cfg in self.configs.items():
            kernel, M, N, K, dtype, _, scheme, _, batch = key
            row = {"kernel": _kernel_name(kernel) if not isinstance(kernel, str) else kernel,
                   "shape": [M // batch, N, K], "batch": batch,
                   "dtype": None if dtype is None else str(dtype).replace("torch.", ""), "scheme": scheme,
                   "config": dataclasses.asdict(cfg), "name": cfg.short(), "source": self.sources.get(key)}
            if row not in rows:
                rows.append(row)
        return rows


TUNER = Tuner(SETTINGS)


def chosen_configs() -> list[dict]:
    """TUNER.chosen_configs(): the GEMM configs this module's launches ran with."""
    return TUNER.chosen_configs()


def tuned_gemm(kernel, x2: torch.Tensor, N: int, scheme: str, min_block_n: int, launch, batch: int = 1) -> tuple:
    """(cfg, launch(cfg)) with the tile config for this GEMM: TUNER's choice, made the first time the key is seen
    (tuned on a GPU). `launch(cfg)` prepares the operands, allocates the outputs and launches `kernel`; it must
    only write buffers it allocates (tuning calls it several times). `batch` > 1: x2 holds that many products'
    rows (batched_operands), run by the Triton tile only (the Hopper twin has no batch), split-K never."""
    M, K = x2.shape
    key = (kernel, M, N, K, x2.dtype, x2.device, scheme, min_block_n, batch)
    cfg = TUNER.configs.get(key)
    if cfg is None:  # the per-call path is this one dict lookup (the disk key costs ~30 us of host time)
        cfg = TUNER.choose(key, x2, N, launch)
    return cfg, launch(cfg)


def tensor_key(t: torch.Tensor) -> tuple:
    """What a cache kept on a tensor compares to reuse a result: the tensor's storage, version counter (bumped by
    every in-place write: optimizer steps, load_state_dict, mul_ under no_grad) and layout."""
    return (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def cached_split(weight: torch.Tensor, kn_layout: bool) -> tuple:
    """The weight's fp16 hi/lo parts and column scales, computed once and reused while the weight is the same
    tensor with the same storage and version counter: an optimizer step, `load_state_dict`, `w.mul_()` under
    no_grad or a reassigned Parameter all invalidate it. (Writes through `w.data` bypass the version counter;
    call `weight._kfuse_split = None` after such a write.)"""
    key = (tensor_key(weight), kn_layout)
    hit = getattr(weight, "_kfuse_split", None)
    if hit is not None and hit[0] == key:
        return hit[1]
    with torch.no_grad():
        parts = split_weight(weight.t() if kn_layout else weight)
    weight._kfuse_split = (key, parts)
    return parts


def gemv_sums(weight: torch.Tensor, bias: torch.Tensor | None, kn_layout: bool) -> tuple:
    """The GEMV region's operands (the GEMM row-sum kind): W's rows summed in float64, (K,) contiguous (W's columns when
    kn_layout: W is (K, N)), and sum(b) as a 1-element float64 tensor (a Python float would reach the kernel as
    fp32; zero without a bias). Reads all of W: 4 * N * K bytes."""
    with torch.no_grad():
        w_sum = weight.sum(1 if kn_layout else 0, dtype=torch.float64).contiguous()
        if bias is None:
            return w_sum, torch.zeros(1, device=weight.device, dtype=torch.float64)
        return w_sum, bias.sum(dtype=torch.float64).reshape(1)


def cached_gemv_sums(weight: torch.Tensor, bias: torch.Tensor | None, kn_layout: bool) -> tuple:
    """gemv_sums, kept on the weight and reused while W and b are the same tensors with the same storage and
    version counters: an optimizer step, `load_state_dict`, an in-place change under no_grad or a reassigned
    Parameter (W or b) all invalidate it. The entry holds b itself and compares it by identity, so a new bias
    allocated where a freed one lived is never taken for it. (Writes through `.data` bypass the version
    counter, as for cached_split: set `weight._kfuse_gemv = None` after one.)"""
    key = (tensor_key(weight), None if bias is None else tensor_key(bias), kn_layout)
    hit = getattr(weight, "_kfuse_gemv", None)
    if hit is not None and hit[0] == key and hit[1] is bias:
        return hit[2]
    sums = gemv_sums(weight, bias, kn_layout)
    weight._kfuse_gemv = (key, bias, sums)
    return sums


def pick_kernel(kernel, kernel_sm90, cfg: GemmConfig):
    """The region kernel a config runs: its Hopper twin (GEMM tile in Gluon) for sm90 configs."""
    return kernel_sm90 if cfg.sm90 else kernel


def sm90_options(cfg: GemmConfig, M: int = 0, N: int = 0, K: int = 0, device=None) -> dict:
    """Launch arguments only the Hopper twin takes: its stages, its promotion chunk, whether its grid is persistent,
    the register cap at launch (sm90_maxnreg) that leaves the producer warp's group its share, and for a persistent
    grid of an (M, N, K) GEMM on `device` its tail split (sm90_tail)."""
    if not cfg.sm90:
        return {}
    options = {"STAGES": cfg.num_stages, "CHUNK": cfg.chunk, "PERSISTENT": cfg.persistent,
               "maxnreg": sm90_maxnreg(cfg.num_warps)}
    return options | sm90_tail(cfg, M, N, K, device) if cfg.persistent and device is not None else options


TAIL_SLICES = 8  # at most: the block that finishes a tail tile reads its slices (64 KB each) back from L2


def sm90_tail(cfg: GemmConfig, M: int, N: int, K: int, device) -> dict:
    """The persistent twin's tail split (kernels/gemm_sm90.py, sm90_tail_piece): where the tiles leave a last wave
    of at most half the blocks, its tiles are cut along K into S = min(blocks // tail, TAIL_SLICES, K blocks)
    slices, a block each, after the full waves. Problem 39 (4096 tiles of 128 x 128 on 132 SMs): 31 full waves,
    then 4 tiles in 8 slices each (~1/8 of a tile's time, plus the sum) instead of a 32nd tile-time with 128 SMs
    idle. Returns the twin's TAIL, tail_split and its workspace (slices) and counters (zeroed here: one
    memset), or nothing where no split applies."""
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    blocks = gemm_grid(M, N, cfg, device)[0]  # the persistent grid: min(tiles, SMs)
    tail = tiles % blocks if blocks else 0
    split = min(blocks // tail, TAIL_SLICES, cdiv(K, cfg.block_k)) if tail else 1
    if split < 2:
        return {}
    return {"TAIL": True, "tail_split": split,
            "tail_ws": torch.empty(tail * split * cfg.block_m * cfg.block_n, device=device, dtype=torch.float32),
            "tail_cnt": torch.zeros(tail, device=device, dtype=torch.int32)}


def gemm_grid(M: int, N: int, cfg: GemmConfig, device) -> tuple:
    """The launch grid of a GEMM kernel: one block per tile, or one per SM (at most one per tile) for persistent
    sm90 configs, whose blocks walk the tiles."""
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    return (min(tiles, _num_sms(device)),) if cfg.sm90 and cfg.persistent else (tiles,)


def gemm_operands(x2: torch.Tensor, weight: torch.Tensor, kn_layout: bool, scheme: str, cfg: GemmConfig) -> tuple:
    """(ops, k_run, strides): the six operand pointers, the K the tile kernel runs to and the four strides
    gemm_tile takes, for x2 (M, K) and a parameter weight ((N, K) nn.Linear layout, or (K, N) for `x @ W` when
    kn_layout), whose split is cached until it changes (cached_split). k_run is K, or padded_k(K) where both
    operands are pre-split (their rows zero-padded: every K block full). Skinny "fp64" configs with k_slices run the
    split-K pass here: the operands are then its float64 partials (kernels/skinny.py)."""
    b = weight.t() if kn_layout else weight  # (N, K) view either way
    plain = unsplit_operands(x2, b, scheme, cfg)
    if plain is not None:
        return plain
    if cfg.k_slices:  # long K: the slices' partial products first, in the same scheme (kernels/long_k.py)
        part, strides = split_k_partials(split_x(x2.float()), cached_split(weight, kn_layout), x2.shape[1], scheme,
                                         cfg)
        return (part,) * 6, x2.shape[1], strides
    return split_operands(x2.float(), cached_split(weight, kn_layout), cfg, split_x)


def unsplit_operands(x2: torch.Tensor, b: torch.Tensor, scheme: str, cfg: GemmConfig) -> tuple | None:
    """gemm_operands' result for the schemes that read fp32 operands as they lie (None for the split ones)."""
    K = x2.shape[1]
    if scheme in ("ieee", "fp64") and interpreting() and x2.dtype != torch.float32:
        x2, b = x2.float(), b.float()  # the interpreter mishandles bf16: read fp32 operands
    if scheme == "fp64" and cfg.k_slices:
        # skinny split-K: K summed first into float64 partials, which become the tile kernel's A operand
        part, strides = fp64_partials(x2, b, cfg)
        return (part,) * 6, K, strides
    if scheme not in SPLIT_SCHEMES:
        return (x2, x2, x2, b, b, b), K, (x2.stride(0), x2.stride(1), b.stride(0), b.stride(1))
    return None


def split_operands(x2: torch.Tensor, w_parts: tuple, cfg: GemmConfig, splitter) -> tuple:
    """gemm_operands' result on the split scheme for fp32 x2 and B's parts: x split in the kernel (cfg.split_a) or
    beforehand by `splitter` (split_x, or split_any for a view that may be transposed)."""
    w_hi, w_lo, w_scale = w_parts
    K = x2.shape[1]
    if cfg.split_a:  # fp32 x split in the kernel (2: its row scales too); x's own K, masked
        x_scale = x2 if cfg.split_a == 2 else row_scales(x2)
        return (x2, x2, x_scale, w_hi, w_lo, w_scale), K, (x2.stride(0), x2.stride(1), w_hi.stride(0), w_hi.stride(1))
    if cfg.sm90:
        ensure_tma_allocator()  # the Gluon tile makes its TMA descriptors on the device
    x_hi, x_lo, x_scale = splitter(x2)
    return ((x_hi, x_lo, x_scale, w_hi, w_lo, w_scale), padded_k(K),
            (x_hi.stride(0), x_hi.stride(1), w_hi.stride(0), w_hi.stride(1)))


def split_any(t: torch.Tensor) -> tuple:
    """split_x's parts of any 2-d fp32 t: a transposed view (A.T, or B^T of a (K, N) B) through split_transposed
    (tiled, no torch transposed copy: 4.4 ms for a 524288 x 256 one on an H100), the same bits."""
    return split_transposed(t) if unit_row_stride(t) else split_x(t.contiguous())


def product_operands(x2: torch.Tensor, w: torch.Tensor, kn_layout: bool, scheme: str, cfg: GemmConfig) -> tuple:
    """gemm_operands for a product of two values (`a @ b`, `bmm` of one product, ...): both split on every call,
    never kept (the next call's tensors may hold other values), transposed views without a copy; long K split
    inside the tile (long_k.split_k_inputs), B read as it lies."""
    b = w.t() if kn_layout else w  # (N, K) view either way
    plain = unsplit_operands(x2, b, scheme, cfg)
    if plain is not None:
        return plain
    x2, b = x2.float(), b.float()
    if cfg.k_slices:
        part, strides = split_k_inputs(x2, b, cfg)
        return (part,) * 6, x2.shape[1], strides
    return split_operands(x2, split_any(b), cfg, split_any)


def batched_operands(x3: torch.Tensor, w3: torch.Tensor, scheme: str, cfg: GemmConfig) -> tuple:
    """(ops, k_run, strides, batch_strides) for B independent products x3[b] @ w3[b], x3 (B, M, K), w3 (B, K, N):
    what gemm_operands gives for one product, with each operand's step from one product to the next (the kernel
    offsets its pointers by program_id(1) times these: A, A's row scales, B, B's row scales). Activations on both
    sides, so nothing is cached; skinny products run the float64 tile without split-K."""
    B, M, K = x3.shape
    N = w3.shape[2]
    b3 = w3.transpose(1, 2)  # (B, N, K) views
    if scheme in ("ieee", "fp64") and interpreting() and x3.dtype != torch.float32:
        x3, b3 = x3.float(), b3.float()  # the interpreter mishandles bf16: read fp32 operands
    if scheme not in SPLIT_SCHEMES:
        return ((x3, x3, x3, b3, b3, b3), K, (x3.stride(1), x3.stride(2), b3.stride(1), b3.stride(2)),
                (x3.stride(0), 0, b3.stride(0), 0))
    x2 = x3.reshape(B * M, K).float()
    # every product's rows scaled on their own; w3 (B, K, N) row-major is split through its transpose, not copied
    w_hi, w_lo, w_scale = (split_transposed(b3) if b3.dtype == torch.float32 and unit_row_stride(b3)
                           else split_weight(b3.reshape(B * N, K)))
    w_steps = (N * w_hi.stride(0), N)
    if cfg.split_a:
        x_scale = x2 if cfg.split_a == 2 else row_scales(x2)
        return ((x2, x2, x_scale, w_hi, w_lo, w_scale), K, (x2.stride(0), x2.stride(1), w_hi.stride(0), w_hi.stride(1)),
                (M * x2.stride(0), M, *w_steps))
    x_hi, x_lo, x_scale = split_x(x2)
    return ((x_hi, x_lo, x_scale, w_hi, w_lo, w_scale), padded_k(K),
            (x_hi.stride(0), x_hi.stride(1), w_hi.stride(0), w_hi.stride(1)), (M * x_hi.stride(0), M, *w_steps))


def saved_for_backward(z: torch.Tensor, ops: tuple, scheme: str, cfg: GemmConfig) -> tuple:
    """What a training forward (save_z) keeps for backward: z, and where the GEMM ran "fp16x3p" on x split
    beforehand (gemm_operands), that split (x_hi, x_lo, x_scale: 4 bytes per element of x, kept until backward),
    which the dW GEMM then reads instead of splitting X^T again (kernels/backward.py, gemm_dw_presplit)."""
    if scheme == "fp16x3p" and cfg.split_a is False and not cfg.k_slices:
        return (z, *ops[:3])
    return (z,)


def tile_group(n_cols: int, groups: int) -> int:
    """Channels per group for the one-kernel GroupNorm (the kind whose column tiles hold whole groups) and its fused
    backward: whole groups inside a column tile need a power of two of at most 128 that divides the width."""
    group = n_cols // groups if groups > 0 else 0
    if group < 1 or group * groups != n_cols or group & (group - 1) or group > 128:
        raise ValueError(f"this fused GroupNorm kernel needs power-of-two groups of at most 128 channels, not "
                         f"{n_cols} channels in {groups} groups: run kfuse optimize at these sizes")
    return group


def group_slots(block_n: int, group: int) -> int:
    """How many GroupNorm groups of `group` channels one column tile [t * block_n, (t + 1) * block_n) can
    touch, over all t: the partial slots per tile of the two-phase GroupNorm (the two-phase GroupNorm kind).
    Groups a multiple of the tile: 1; tiles a multiple of the group: block_n / group; otherwise a tile may
    start inside one group and end inside another: at most (block_n - 1) // group + 2."""
    if group % block_n == 0:
        return 1
    if block_n % group == 0:
        return block_n // group
    return (block_n - 1) // group + 2


def as_vector(t: torch.Tensor) -> torch.Tensor:
    """A parameter as the contiguous 1-d vector the kernels index by column."""
    if t is None:  # e.g. a GroupNorm built with affine=False where the captured model had affine=True
        raise ValueError("kfuse: a parameter this ModelNew's kernels read is None: construct ModelNew with the "
                         "arguments of the Model it was generated from")
    return t if t.dim() == 1 and t.is_contiguous() else t.reshape(-1).contiguous()


@triton.jit
def _tanh(x):
    # tanh(x) = sign(x) * -expm1(-2|x|) / (2 + expm1(-2|x|)), expm1(u) = (e^u - 1) * u / log(e^u) (Kahan's
    # trick: exact where e^u rounds to 1, a few ulps elsewhere); |x| > 15 is +-1 in fp32
    u = -2.0 * tl.minimum(tl.abs(x), 15.0)
    e = tl.exp(u)
    em1 = tl.where(e == 1.0, u, (e - 1.0) * u / tl.log(e))
    return tl.where(x < 0.0, 1.0, -1.0) * em1 / (2.0 + em1)


@triton.jit
def _softplus(x, beta, threshold):
    # torch.nn.functional.softplus: x where beta*x > threshold, else log1p(exp(beta*x)) / beta, log1p(u) as
    # log(1 + u) * u / ((1 + u) - 1) (Goldberg): a few ulps where log(1 + u) alone loses u's low bits (x very negative)
    bx = x * beta
    u = tl.exp(tl.minimum(bx, threshold))
    log1p = tl.where(1.0 + u == 1.0, u, tl.log(1.0 + u) * u / (1.0 + u - 1.0))
    return tl.where(bx > threshold, x, log1p / beta)

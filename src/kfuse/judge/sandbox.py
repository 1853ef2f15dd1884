"""The privilege boundary around a candidate: bubblewrap (user, pid, net, mount, ipc, uts namespaces) plus
kernel-enforced resource limits.

Inside the sandbox the candidate sees: the system's libraries and the Python installation read-only, the
kfuse package read-only, the judge's request folder read-only at /judge, and a private tmpfs at /tmp (its
only writable place, size-capped). No home, no reference file, no database, no output path, no network,
no other process (its own pid namespace: the judge is invisible, so it can be neither signalled nor
traced), an environment of a dozen fixed variables. On the GPU the NVIDIA device nodes are the only devices
passed in. Limits (memory, file size, CPU time, open files, processes) are set with `prlimit` on bubblewrap
itself, so the kernel enforces them on everything the candidate starts; where a pids cgroup can be made,
it caps the process count too (root ignores RLIMIT_NPROC). Killing bubblewrap ends the pid namespace and so
every process the candidate started, exited or not.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import kfuse

SANDBOX_UID = 65534  # "nobody" inside the user namespace
IO_DIR = "/judge"  # the judge's request folder, read-only inside
SCRATCH = "/tmp"  # the private tmpfs
COMPILE_CACHE = "/tmp/cache"  # Triton, load_inline, Inductor and XDG caches: kept across runs of the same file
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
# Enough of /etc for the dynamic loader, user names and compilers (gcc/nvcc via /etc/alternatives).
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd",
             "/etc/group", "/etc/nsswitch.conf", "/etc/localtime")
PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUTLASS_PATH")
GIB = 1 << 30


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 64 * GIB


@dataclass(frozen=True)
class Limits:
    """Per-process kernel limits for the sandbox (RLIMIT_AS is left alone: CUDA reserves huge address
    ranges; RLIMIT_DATA counts the writable private memory a process really maps). None: the default
    for this machine (`limits_for`)."""

    memory_bytes: int | None = None  # default: 3/4 of the machine's memory, at most 64 GiB
    file_bytes: int = 512 << 20  # any one file, the worker's log included
    scratch_bytes: int = 4 * GIB  # the tmpfs at /tmp
    open_files: int = 4096
    processes: int = 4096  # RLIMIT_NPROC also counts the user's other processes (outside: ucounts)
    cpu_s: int | None = None  # default: every core busy for the whole timeout, plus a minute


def limits_for(timeout_s: float, base: Limits = Limits(), cores: int | None = None) -> Limits:
    """`base` with its machine-dependent defaults filled in."""
    cores = cores or os.cpu_count() or 1
    memory = base.memory_bytes or min(64 * GIB, _physical_memory() * 3 // 4)
    cpu = base.cpu_s or int(timeout_s * cores) + 60
    return replace(base, memory_bytes=memory, cpu_s=cpu)


@dataclass(frozen=True)
class Sandbox:
    """How one worker is started: the argv prefix that wraps `python -m kfuse.judge.worker ...`."""

    io_dir: Path  # host folder bound read-only at IO_DIR
    gpu: bool
    interpret: bool
    limits: Limits  # filled in (limits_for)
    compile_cache: Path | None = None  # host folder bound writable at COMPILE_CACHE (this file's own cache)


# --- can it start here? --------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def userns_blocker() -> str | None:
    """A sysctl that forbids unprivileged user namespaces, in words, or None."""
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return "user namespaces are disabled (user.max_user_namespaces = 0)"
    if os.geteuid() != 0 and _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)"
    if os.geteuid() != 0 and _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
        return "AppArmor forbids unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)"
    return None


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the sandbox cannot start on this machine (one line), or None when it can. Runs a trivial
    program in the same namespaces the worker gets, once per process."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if shutil.which("prlimit") is None:
        return "prlimit (util-linux) is not installed"
    blocker = userns_blocker()
    if blocker:
        return blocker
    argv = ["bwrap", *_namespace_args(), *_system_binds(), "--", "/bin/true"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap did not run: {type(err).__name__}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return f"bwrap cannot create its namespaces here: {last}"
    return None


# --- the command line ----------------------------------------------------------------------------------


def _namespace_args() -> list[str]:
    return ["--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "judge",
            "--clearenv", "--proc", "/proc", "--dev", "/dev"]


def _system_binds() -> list[str]:
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.lexists(d):
            # /lib -> usr/lib on merged-/usr systems: recreate the link rather than bind it twice
            args += ["--symlink", os.readlink(d), d] if os.path.islink(d) else ["--ro-bind", d, d]
    for f in ETC_FILES:
        args += ["--ro-bind-try", f, f]
    return args


KFUSE_LIB = "/opt/kfuse-lib"  # inside the sandbox: holds only the kfuse package


def python() -> str:
    """This interpreter's path without `..` (`../.venv/bin/python` run from a subfolder): inside the sandbox only
    the Python folders exist, so a path through another folder would not resolve there. Symlinks are kept (a
    virtual environment's python is one)."""
    return os.path.abspath(sys.executable)


def python_dirs() -> list[str]:
    """The folders Python needs to run kfuse's worker with this interpreter and its packages: the base
    installation, the virtual environment, every site-packages, and the kfuse package itself (not the
    folder it lives in: that may hold the user's problems and outputs)."""
    dirs = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix,
            str(Path(kfuse.__file__).resolve().parent)}
    dirs.update(p for p in site.getsitepackages() if os.path.isdir(p))
    user = site.getusersitepackages()
    if isinstance(user, str) and os.path.isdir(user) and user in sys.path:
        dirs.add(user)
    resolved = sorted({str(Path(d).resolve()) for d in dirs} | dirs)
    # bind each folder once: one inside another is covered by its parent, unless it is a different path
    keep = [d for d in resolved if not any(d != p and d.startswith(p.rstrip("/") + "/") for p in resolved)]
    return [d for d in keep if d not in SYSTEM_DIRS and not any(d.startswith(s + "/") for s in SYSTEM_DIRS)]


def header_dirs() -> list[str]:
    """Read-only header folders a candidate's load_inline build may need: $CUTLASS_PATH (CUTLASS's headers where
    they are not a pip package in a bound site-packages; `kfuse optimize --backend cuda` files look there)."""
    d = os.environ.get("CUTLASS_PATH", "")
    return [d] if d and os.path.isdir(d) and d not in SYSTEM_DIRS else []


def gpu_devices() -> list[str]:
    """The NVIDIA device nodes (control, UVM, the cards, MIG capabilities): the only devices on the GPU."""
    return sorted(p for pat in ("/dev/nvidia*", "/dev/nvidia-caps/*") for p in glob.glob(pat)
                  if not os.path.isdir(p))


def environment(box: Sandbox) -> dict[str, str]:
    """The worker's whole environment (bubblewrap clears the rest: no tokens, no paths of the judge's)."""
    env = {
        "PATH": f"{Path(python()).parent}:/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": SCRATCH, "TMPDIR": SCRATCH, "USER": "judge", "LOGNAME": "judge", "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": KFUSE_LIB,
        "TRITON_CACHE_DIR": f"{COMPILE_CACHE}/triton", "TORCH_EXTENSIONS_DIR": f"{COMPILE_CACHE}/torch_extensions",
        "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE}/inductor",
        # a tool's own cache under the XDG cache folder (kfuse's autotuner, CuPy's kernels): kept like the rest
        "XDG_CACHE_HOME": f"{COMPILE_CACHE}/xdg",
    }
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    if box.interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


def prlimit(lim: Limits) -> list[str]:
    """The `prlimit` prefix that sets the limits on the command it starts (and so on all it starts). CPU
    time: SIGXCPU at the limit (the record says so), SIGKILL 5 s later for a process that ignores it."""
    return ["prlimit", f"--data={lim.memory_bytes}", f"--fsize={lim.file_bytes}", f"--cpu={lim.cpu_s}:{lim.cpu_s + 5}",
            f"--nofile={lim.open_files}", f"--nproc={lim.processes}", "--core=0", "--"]


def argv(box: Sandbox, command: Sequence[str]) -> list[str]:
    """`prlimit ... bwrap ... -- command`: limits first (inherited by everything bubblewrap starts)."""
    lim = box.limits
    bwrap = ["bwrap", *_namespace_args(), *_system_binds()]
    # the scratch tmpfs first: binds made after it land on top, so a Python installed under /tmp (a checkout
    # there, its .venv) stays visible instead of being hidden by the scratch folder
    bwrap += ["--size", str(lim.scratch_bytes), "--tmpfs", SCRATCH]
    for d in python_dirs():
        bwrap += ["--ro-bind", d, d]
    for d in header_dirs():
        bwrap += ["--ro-bind", d, d]
    # kfuse itself, alone in a folder on PYTHONPATH: found whether it was installed or reached by the judge's
    # own PYTHONPATH (which the cleared environment drops)
    bwrap += ["--ro-bind", str(Path(kfuse.__file__).resolve().parent), f"{KFUSE_LIB}/kfuse"]
    bwrap += ["--ro-bind", str(box.io_dir), IO_DIR, "--chdir", SCRATCH]
    if box.compile_cache is not None:
        bwrap += ["--bind", str(box.compile_cache), COMPILE_CACHE]
    if box.gpu:
        bwrap += ["--ro-bind", "/sys", "/sys"]  # cuInit needs /sys (error 304 without it)
        for node in gpu_devices():
            bwrap += ["--dev-bind", node, node]  # after --dev: a plain bind gives "insufficient permissions"
    for k, v in environment(box).items():
        bwrap += ["--setenv", k, v]
    bwrap += ["--remount-ro", "/"]  # the folders bwrap made to hold the binds: read-only, /tmp stays writable
    return [*prlimit(lim), *bwrap, "--", *command]


# --- a process-count cap where the machine lets us make a pids cgroup -----------------------------------


def pids_cgroup(processes: int) -> Path | None:
    """A fresh pids cgroup with pids.max set (cgroup v2 or the v1 pids hierarchy), or None when this
    process may not create one. Root is exempt from RLIMIT_NPROC, so this is its only process cap."""
    parents = []
    own = _read("/proc/self/cgroup") or ""
    for line in own.splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "pids":
            parents.append(Path("/sys/fs/cgroup/pids") / rel.lstrip("/"))
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            parents.append(Path("/sys/fs/cgroup") / rel.lstrip("/"))
    for parent in parents:
        _remove_stale(parent)
        group = parent / f"kfuse-judge-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(processes))
            return group
        except OSError:
            try:
                group.rmdir()
            except OSError:
                pass
    return None


def _remove_stale(parent: Path) -> None:
    """Empty groups left by judges that were killed before they could remove their own."""
    try:
        stale = [g for g in parent.glob("kfuse-judge-*-*") if not Path(f"/proc/{g.name.split('-')[2]}").exists()]
    except OSError:
        return
    for group in stale:
        try:
            group.rmdir()
        except OSError:
            pass  # still has processes, or not ours to remove


def pids_cgroup_possible() -> bool:
    group = pids_cgroup(1)
    remove_cgroup(group)
    return group is not None


def enter_cgroup_command(group: Path | None, command: Sequence[str]) -> list[str]:
    """Put the command in `group` before it starts anything: a shell joins the group, then execs it."""
    if group is None:
        return list(command)
    return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *command]


def remove_cgroup(group: Path | None, wait_s: float = 2.0) -> None:
    """Remove the group once its last process is gone (a pid namespace's processes are reaped a moment
    after bubblewrap itself exits)."""
    if group is None:
        return
    deadline = time.monotonic() + wait_s
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)

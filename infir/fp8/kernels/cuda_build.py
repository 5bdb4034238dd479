"""Builds infir's CUDA C++ kernels with nvcc on first use and loads them through ctypes.

Why nvcc + ctypes and not torch.utils.cpp_extension: the kernels take raw pointers and sizes, so
they need neither torch's C++ headers nor a pybind module, and the wrapper around the ctypes call
costs the host no more than the Triton kernels' direct launch does (bench/quant.py --host).

The shared library is cached per (source and the headers beside it, GPU architecture, nvcc version) under
$INFIR_KERNEL_CACHE (default ~/.cache/infir/kernels), written to a temporary name and renamed,
so ranks that build at once do not read each other's half-written files. Where nvcc is missing,
the build fails or the GPU is older than sm_89 (no FP8 conversion instructions), `load` returns
None and callers keep their fallback (the Triton kernels; torch's scaled_mm for lt_wgrad.cu);
INFIR_CUDA_KERNELS=0 (policy.cuda_kernels) makes that the choice.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..policy import kernel_policy

log = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).resolve().parent
_LOADED: dict = {}


def find_nvcc() -> str | None:
    """$CUDA_HOME/bin/nvcc (or $CUDA_PATH's), else nvcc on PATH, else /usr/local/cuda's; None if none exists."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for cand in ([Path(home, "bin", "nvcc")] if home else []) + [shutil.which("nvcc"), Path("/usr/local/cuda/bin/nvcc")]:
        if cand and Path(cand).exists():
            return str(cand)
    return None


def gpu_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    # sm_90a: Hopper's arch-specific target (the generic sm_90 lacks nothing this code uses, but
    # cuBLAS and Triton build for 90a too)
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def cublaslt_flags() -> list[str]:
    """nvcc flags to compile against and link to the libcublasLt torch itself uses (its wheel's copy,
    whose headers sit beside it, else the CUDA toolkit's): two copies in one process would each keep
    their own state."""
    torch.cuda.init()
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if "/libcublasLt.so" in line})
    if not libs:  # not loaded yet: the wheels torch depends on, then the toolkit
        roots = [Path(p) for p in sys.path if p] + [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))]
        libs = sorted(str(c) for r in roots for c in [*glob.glob(str(r / "nvidia/*/lib/libcublasLt.so.*")),
                                                      *glob.glob(str(r / "lib64/libcublasLt.so.*"))])
    if not libs:
        raise RuntimeError("libcublasLt not found (neither loaded by torch nor in its nvidia wheels or $CUDA_HOME)")
    lib = Path(libs[0])
    incs = [lib.parent.parent / "include", Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"]
    inc = next((d for d in incs if (d / "cublasLt.h").exists()), None)
    if inc is None:
        raise RuntimeError(f"cublasLt.h not found in {[str(d) for d in incs]}")
    return [f"-I{inc}", f"-L{lib.parent}", f"-l:{lib.name}", f"-Xlinker=-rpath,{lib.parent}"]


def build(source: Path, arch: str, nvcc: str, extra: tuple | list = ()) -> Path:
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.cuh")))  # what the .cu may include
    key = hashlib.sha256(source.read_bytes() + headers + arch.encode() + version.encode()
                         + " ".join(extra).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("INFIR_KERNEL_CACHE", Path.home() / ".cache" / "infir" / "kernels"))
    out = cache / f"{source.stem}_{arch}_{key}.so"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so.tmp")
    os.close(fd)
    cmd = [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", f"-arch={arch}", "-o", tmp, str(source), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"nvcc failed on {source.name} ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


def load(name: str, device: torch.device, cublaslt: bool = False) -> ctypes.CDLL | None:
    """The library built from kernels/<name>.cu for `device`'s architecture, or None (see module doc).
    cublaslt: the source calls cuBLASLt (built against torch's copy, see cublaslt_flags)."""
    if not kernel_policy().cuda_kernels:
        return None
    key = (name, torch.cuda.get_device_capability(device))
    if key in _LOADED:
        return _LOADED[key]
    lib = None
    if key[1] >= (8, 9):
        nvcc = find_nvcc()
        if nvcc is None:
            log.info("infir: nvcc not found; %s.cu's fallback (Triton kernels, or torch's scaled_mm) stands in", name)
        else:
            try:
                extra = cublaslt_flags() if cublaslt else []
                lib = ctypes.CDLL(str(build(SOURCE_DIR / f"{name}.cu", gpu_arch(device), nvcc, extra)))
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                log.warning("infir: could not build %s.cu, using the Triton kernels instead (torch's scaled_mm for "
                            "lt_wgrad.cu; same bits, slower): %s. "
                            "Fix the nvcc install, point INFIR_KERNEL_CACHE at a writable directory, or set "
                            "INFIR_CUDA_KERNELS=0 to skip the build", name, e)
    _LOADED[key] = lib
    return lib

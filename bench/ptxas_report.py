"""Registers, stack and spills of quant_both.cu's kernels, on a machine with no GPU and no nvcc.

Before a kernel change is run on a GPU, ptxas says whether it still fits the registers its
__launch_bounds__ allow and whether it spills (the run would only show a slower kernel). NVRTC compiles the
file's device code (everything before its first host launcher) to PTX for sm_90a, and ptxas -v reports
on each kernel named. Both come from NVIDIA's PyPI wheels, unpacked into one directory:

    pip download --no-deps -d /tmp/nvw nvidia-cuda-nvcc-cu12==12.8.93 nvidia-cuda-runtime-cu12==12.8.90 \
        nvidia-cuda-nvrtc-cu12==12.8.93
    for w in /tmp/nvw/*.whl; do python3 -m zipfile -e $w /tmp/cuda; done; chmod +x /tmp/cuda/nvidia/cuda_nvcc/bin/ptxas
    python bench/ptxas_report.py --cuda /tmp/cuda

The report is 12.8's; a GPU host that builds with another nvcc may get slightly different figures
(`cuobjdump --dump-resource-usage` on the library it built gives those there).
"""
import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELS = ["Bf16Rows, true, false, 4", "Bf16Rows, false, false, 4", "SwigluBwdRows, true, false, 4",
           "SwigluFwdRows, true, false, 4"]
# NVRTC has no libc headers: the fixed-width types the kernels use, defined for it
STDINT = ("using uint8_t = unsigned char; using uint16_t = unsigned short;\n"
          "using uint32_t = unsigned int; using uint64_t = unsigned long long;\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cuda", type=Path, default=Path("/tmp/cuda"), help="where the wheels were unpacked")
    p.add_argument("--source", type=Path,
                   default=Path(__file__).resolve().parents[1] / "infir/fp8/kernels/quant_both.cu")
    p.add_argument("--kernels", nargs="+", default=KERNELS, help="template arguments of quant_token_both")
    args = p.parse_args()
    nv = args.cuda / "nvidia"
    nvrtc_so, ptxas = nv / "cuda_nvrtc/lib/libnvrtc.so.12", nv / "cuda_nvcc/bin/ptxas"
    for need in (nvrtc_so, ptxas):
        if not need.exists():
            sys.exit(f"{need} is missing: unpack NVIDIA's wheels into --cuda as this script's docstring says")
    src = args.source.read_text()
    cut = src.find("cudaError_t launch_one")
    if cut < 0:
        sys.exit(f"{args.source}: no host launcher (launch_one) to cut the device code at")
    device = src[:src.rfind("template", 0, cut)].replace("#include <cuda_runtime.h>\n", "")
    device = device.replace("#include <stdint.h>\n", STDINT) + "}  // namespace\n"
    header = (args.source.parent / "fp8_common.cuh").read_text().replace("#include <stdint.h>\n", "")

    lib = ctypes.CDLL(str(nvrtc_so))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(rc: int, what: str) -> None:
        if rc:
            sys.exit(f"NVRTC's {what} failed: {lib.nvrtcGetErrorString(rc).decode()}")
    strings = lambda xs: (ctypes.c_char_p * len(xs))(*[x.encode() for x in xs])
    prog = ctypes.c_void_p()
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), device.encode(), args.source.name.encode(), 1,
                                 strings([header]), strings(["fp8_common.cuh"])), "nvrtcCreateProgram")
    for k in args.kernels:
        check(lib.nvrtcAddNameExpression(prog, f"&quant_token_both<{k}>".encode()), f"name quant_token_both<{k}>")
    opts = ["-arch=compute_90a", "--std=c++17", "-default-device", f"-I{nv}/cuda_runtime/include"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), strings(opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(f"NVRTC could not compile {args.source.name} (check --kernels' template arguments against the "
                 f"kernel's):\n{log.value.decode()}")
    lowered = {}
    for k in args.kernels:
        name = ctypes.c_char_p()
        check(lib.nvrtcGetLoweredName(prog, f"&quant_token_both<{k}>".encode(), ctypes.byref(name)),
              f"lowered name of quant_token_both<{k}>")
        lowered[name.value.decode()] = k
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_bytes(ptx.value)
        out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", "-O3", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"ptxas failed:\n{out.stderr}")
    for line in out.stderr.splitlines():
        if "Compiling entry" in line:
            mangled = line.split("entry function '")[1].split("'")[0]
            print(f"quant_token_both<{lowered.get(mangled, mangled)}>")
        elif "stack frame" in line or "registers" in line:
            print("   ", line.replace("ptxas info    : ", "").strip())


if __name__ == "__main__":
    main()

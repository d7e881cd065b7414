"""Builds benchmarks/cpp_hook.cpp against the installed torch, for per_call.py's row of a
forward hook written in C++ (a measurement of a way further, not part of the package).

`build()` returns the module, or a string saying why there is none (no C or C++ compiler, no
torch headers, a failed compile). The build (~25 s on 2 cores) is kept in the temporary folder,
named by a hash of the sources (this file's commands included), the torch version and the
interpreter, and reused. C++20: torch 2.15's headers require it (2.6 and 2.13 build with it too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch

import singlecard_nb.inspection.kernel as kernel_package
from singlecard_nb.inspection.kernel import build as kernel_build

SOURCE = Path(__file__).with_name("cpp_hook.cpp")
KERNEL = Path(kernel_package.__file__).with_name("onepass.c")


def build() -> ModuleType | str:
    try:
        cc = kernel_build.compiler()  # the kernel's own: $CC, cc, gcc or clang
    except RuntimeError as e:
        return str(e)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    torch_dir = Path(torch.__file__).parent
    include = torch_dir / "include"
    if not cxx:
        return "no C++ compiler found (looked for $CXX, g++, c++)"
    if not (include / "torch" / "extension.h").exists():
        return f"this torch ({torch.__version__}) ships no C++ headers"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    key = hashlib.sha256(SOURCE.read_bytes() + KERNEL.read_bytes() + Path(__file__).read_bytes()
                         + f"{torch.__version__} {sys.version}".encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"singlecard_nb_cpp_hook_{key}"
    library = folder / f"cpp_hook{suffix}"
    if not library.exists():
        folder.mkdir(exist_ok=True)
        abi = int(torch.compiled_with_cxx11_abi())
        commands = [
            [cc, "-O3", "-fPIC", "-march=native", "-c", str(KERNEL), "-o", str(folder / "k.o")],
            [cxx, "-O3", "-fPIC", "-march=native", "-shared", "-std=c++20", "-w",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=cpp_hook",
             f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
             f"-I{sysconfig.get_paths()['include']}", str(SOURCE), str(folder / "k.o"),
             f"-L{torch_dir / 'lib'}", "-ltorch", "-ltorch_cpu", "-lc10", "-ltorch_python",
             f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(folder / f"tmp{suffix}")],
        ]
        for command in commands:
            done = kernel_build.run_compiler(command, kernel_build.COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                return f"the build failed: {last}"
        os.replace(folder / f"tmp{suffix}", library)  # whole, or not there
    spec = importlib.util.spec_from_file_location("cpp_hook", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

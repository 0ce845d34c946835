"""compile_cuda: kernels that codegen/gpu emits compile to cubin (NVRTC and nvcc) and PTX, without a GPU.

No test touches the CUDA driver. Each route's tests skip, naming what is missing, where it does not exist.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from aotc.codegen.cuda_compiler import (
    GPUCompileError,
    compile_cuda,
    cuda_compiler_name,
    nvcc_path,
    nvrtc_version,
)
from aotc.codegen.gpu import emit_gpu
from aotc.schedule.lower import lower
from aotc.target import parse_target
from tests.test_gpu_codegen import SCHEDULES, matmul_schedule

needs_nvrtc = pytest.mark.skipif(
    nvrtc_version() is None, reason="NVRTC not loadable (pip install 'aotc[cuda]')"
)
needs_nvcc = pytest.mark.skipif(
    nvcc_path() is None, reason="nvcc is not on PATH (CUDA toolkit not installed)"
)
needs_compiler = pytest.mark.skipif(
    cuda_compiler_name() is None, reason="neither NVRTC (pip install 'aotc[cuda]') nor nvcc is available"
)
EM_CUDA = 190


def cubin_sm(cubin: bytes) -> int:
    """The SM a cubin is for, from its ELF header (CUDA's ELF ABI keeps it in bits 8-15 of e_flags)."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2, "not a 64-bit ELF file"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    assert machine == EM_CUDA, f"ELF machine {machine}, not EM_CUDA"
    (flags,) = struct.unpack_from("<I", cubin, 48)
    return (flags >> 8) & 0xFF


def cuda_source(workload: str, arch: str = "sm_90") -> tuple[str, list[str]]:
    dag, state = SCHEDULES[workload]()
    module = emit_gpu(lower(state, workload), parse_target(f"cuda -arch={arch}"))
    return module.cuda_source, [k.name for k in module.kernels]


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("workload", sorted(SCHEDULES))
def test_nvrtc_compiles_cubin_for_the_arch(workload, arch):
    source, kernels = cuda_source(workload, arch)
    cubin = compile_cuda(source, arch, compiler="nvrtc")
    assert cubin_sm(cubin) == int(arch.removeprefix("sm_"))
    for name in kernels:
        assert name.encode() in cubin


@needs_nvrtc
def test_nvrtc_ptx_targets_the_arch_and_has_no_trailing_nul():
    source, _ = cuda_source("matmul")
    ptx = compile_cuda(source, "sm_90", output="ptx", compiler="nvrtc")
    assert not ptx.endswith(b"\0")
    text = ptx.decode()
    assert ".target sm_90" in text and "bar.sync" in text and ".shared" in text
    assert ".visible .entry matmul" in text  # extern "C": the name the runtime looks up


@needs_nvrtc
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_and_nvcc_both_give_a_cubin_for_the_arch(arch):
    source, kernels = cuda_source("softmax", arch)
    for compiler in ("nvrtc", "nvcc"):
        cubin = compile_cuda(source, arch, compiler=compiler)
        assert cubin_sm(cubin) == int(arch.removeprefix("sm_")), compiler
        assert all(name.encode() in cubin for name in kernels), compiler


@needs_nvcc
def test_nvcc_ptx_targets_the_arch():
    source, _ = cuda_source("matmul")
    assert ".target sm_90" in compile_cuda(source, "sm_90", output="ptx", compiler="nvcc").decode()


@needs_compiler
def test_default_route_is_the_one_reported():
    source, _ = cuda_source("bias_relu")
    assert cuda_compiler_name() == ("nvrtc" if nvrtc_version() is not None else "nvcc")
    assert cubin_sm(compile_cuda(source, "sm_80")) == 80


@pytest.mark.parametrize(
    "compiler", [pytest.param("nvrtc", marks=needs_nvrtc), pytest.param("nvcc", marks=needs_nvcc)]
)
def test_syntax_error_gives_the_compiler_log(compiler):
    source = 'extern "C" __global__ void broken(float* a) { a[0] = ; }\n'
    with pytest.raises(GPUCompileError, match=r"(?s)failed for sm_90.*expected an expression"):
        compile_cuda(source, "sm_90", compiler=compiler)


@needs_nvrtc
def test_nvrtc_rejects_an_arch_it_does_not_know():
    source, _ = cuda_source("sum")
    with pytest.raises(GPUCompileError, match=r"does not compile for sm_70 \(it knows sm_75, sm_80"):
        compile_cuda(source, "sm_70", compiler="nvrtc")


@needs_nvrtc
def test_nvrtc_timeout_cancels_the_compilation():
    dag, state = matmul_schedule()
    source = emit_gpu(lower(state, "mm")).cuda_source
    with pytest.raises(GPUCompileError, match="took more than"):
        compile_cuda(source, "sm_90", compiler="nvrtc", timeout=-1.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"arch": "90"}, "arch must look like sm_90"),
        ({"arch": "compute_90"}, "arch must look like sm_90"),
        ({"output": "fatbin"}, "output must be 'cubin' or 'ptx'"),
        ({"compiler": "clang"}, "compiler must be 'nvrtc', 'nvcc' or None"),
        ({"source": "int x;\0"}, "NUL character"),
    ],
)
def test_bad_arguments_are_refused_before_compiling(kwargs, message):
    args = {"source": "int x;", "arch": "sm_90"} | kwargs
    with pytest.raises(ValueError, match=message):
        compile_cuda(**args)


# fresh interpreters: one where `import cuda.bindings` fails (the extra not installed), one where the
# binding imports but cuda.pathfinder finds no libnvrtc (the nvidia-cuda-nvrtc wheel missing)
NO_BINDING = "import sys; sys.modules['cuda.bindings'] = None\n"
NO_LIBNVRTC = (
    "import cuda.pathfinder as p\n"
    "def missing(name): raise p.DynamicLibNotFoundError('lib' + name + ' not found')\n"
    "p.load_nvidia_dynamic_lib = missing\n"
)
FALLBACK = (
    "from aotc.codegen.cuda_compiler import compile_cuda, cuda_compiler_name, nvrtc_version\n"
    "cubin = compile_cuda('extern \"C\" __global__ void k(float* a) { a[0] = 1.0f; }', 'sm_80')\n"
    "print(cuda_compiler_name(), nvrtc_version(), cubin[:4] == b'\\x7fELF')\n"
)


@needs_nvcc
@pytest.mark.parametrize(
    "setup", [NO_BINDING, pytest.param(NO_LIBNVRTC, marks=needs_nvrtc)], ids=["no-binding", "no-libnvrtc"]
)
def test_without_nvrtc_nvcc_compiles(setup):
    proc = subprocess.run(
        [sys.executable, "-c", setup + FALLBACK], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["nvcc", "None", "True"]


@needs_nvrtc
def test_missing_libnvrtc_is_named_when_nvrtc_is_asked_for():
    code = NO_LIBNVRTC + (
        "from aotc.codegen.cuda_compiler import GPUCompileError, compile_cuda\n"
        "try:\n    compile_cuda('int x;', 'sm_90', compiler='nvrtc')\n"
        "except GPUCompileError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "NVRTC is not available: libnvrtc could not be loaded" in proc.stdout
    assert "libnvrtc not found" in proc.stdout


def test_source_must_be_text():
    with pytest.raises(TypeError, match="CUDA source must be a str, got bytes"):
        compile_cuda(b"int x;", "sm_90")


def test_no_compiler_is_a_clear_error(monkeypatch):
    from aotc.codegen import cuda_compiler

    monkeypatch.setattr(cuda_compiler, "nvcc_path", lambda: None)
    with pytest.raises(GPUCompileError, match="nvcc is not on PATH"):
        compile_cuda("int x;", "sm_90", compiler="nvcc")

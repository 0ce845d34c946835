"""aotc_runtime: load and run models compiled by aotc. Depends on numpy only.

import aotc_runtime
model = aotc_runtime.load("resnet18.aotc")
outputs = model.run({"input": x})

A package built for `opencl` or `cuda -arch=sm_XX` loads as a GPUModel (pyopencl or cuda-bindings, the
`opencl` and `cuda` extras, are imported only then).
"""

from aotc_runtime.gpu import GPUError, GPUUnavailable
from aotc_runtime.gpu_model import GPUModel
from aotc_runtime.model import CompiledModel, KernelTime, TensorInfo, load
from aotc_runtime.package import FORMAT_VERSION, PackageError, VerifiedPackage, read_manifest, verify_package
from aotc_runtime.signing import SignatureError

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "CompiledModel",
    "GPUError",
    "GPUModel",
    "GPUUnavailable",
    "KernelTime",
    "PackageError",
    "SignatureError",
    "TensorInfo",
    "VerifiedPackage",
    "load",
    "read_manifest",
    "verify_package",
]

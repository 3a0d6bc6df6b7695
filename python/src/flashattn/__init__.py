"""flashattn: exact, IO-aware attention (the FlashAttention family).

The functions here are the C++ library's entry points over any tensor that exports DLPack or
the buffer protocol (PyTorch, CuPy, JAX inputs, NumPy): nothing is copied, outputs are provided
by the caller and written in place, CUDA work runs on the caller's current stream (torch, CuPy)
or on ``stream=``. PyTorch users want :mod:`flashattn.torch` (flash-attn's interface, autograd,
torch.compile); attention over several GPUs (context parallelism: ring, all-to-all) is
:mod:`flashattn.distributed`.

Errors: ValueError (a bad value or shape), TypeError (a bad dtype, device or object),
NotImplementedError (valid, but not built or not implemented), RuntimeError (the backend
failed); the message names the argument. Nothing is written when one is raised.

C++: the package also holds the library's headers, static library and CMake package;
:func:`cmake_prefix_path` tells CMake where (``find_package(flashattn)``).
"""
import os as _os

from ._C import (
    __version__,
    backward,
    built_with_cuda,
    built_with_nccl,
    cuda_available,
    forward,
    forward_kvcache,
    reference_backward,
    reference_forward,
)


def cmake_prefix_path() -> str:
    """The folder to add to ``CMAKE_PREFIX_PATH`` so that CMake's ``find_package(flashattn
    CONFIG REQUIRED)`` finds the C++ library this package was built with: it holds
    ``include/flashattn``, the library in ``lib`` and ``lib/cmake/flashattn/flashattnConfig.cmake``.
    Link ``flashattn::flashattn``.
    """
    return _os.path.dirname(_os.path.abspath(__file__))


__all__ = [
    "__version__",
    "backward",
    "built_with_cuda",
    "built_with_nccl",
    "cmake_prefix_path",
    "cuda_available",
    "forward",
    "forward_kvcache",
    "reference_backward",
    "reference_forward",
]

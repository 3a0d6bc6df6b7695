"""flashattn: exact, IO-aware attention (the FlashAttention family).

The functions here are the C++ library's entry points over any tensor that exports DLPack or
the buffer protocol (PyTorch, CuPy, JAX inputs, NumPy): nothing is copied, outputs are provided
by the caller and written in place, CUDA work runs on the caller's current stream (torch, CuPy)
or on ``stream=``. PyTorch users want :mod:`flashattn.torch` (flash-attn's interface, autograd,
torch.compile).

Errors: ValueError (a bad value or shape), TypeError (a bad dtype, device or object),
NotImplementedError (valid, but not built or not implemented), RuntimeError (the backend
failed); the message names the argument. Nothing is written when one is raised.
"""
from ._C import (
    __version__,
    backward,
    built_with_cuda,
    cuda_available,
    forward,
    reference_backward,
    reference_forward,
)

__all__ = [
    "__version__",
    "backward",
    "built_with_cuda",
    "cuda_available",
    "forward",
    "reference_backward",
    "reference_forward",
]

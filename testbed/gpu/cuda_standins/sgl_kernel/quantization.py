"""`sgl_kernel.quantization` stand-in: SGLang imports it on CUDA; the test bed never calls into it."""

from ._stub import module_getattr

__getattr__ = module_getattr(__name__)

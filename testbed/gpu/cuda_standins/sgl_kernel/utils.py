"""``sgl_kernel.utils`` stand-in: the Triton attention backend asks whether PDL is supported."""

from ._stub import module_getattr, used


@used
def is_arch_support_pdl(*args, **kwargs):
    return False  # no programmatic dependent launch without the real kernels


__getattr__ = module_getattr(__name__)

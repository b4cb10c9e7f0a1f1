"""``flash_mla`` stand-in: EAGLEWorkerV2 imports FlashMLABackend on CUDA to list graph-capable
backends; the test bed never calls into it."""

from sgl_kernel._stub import module_getattr

__getattr__ = module_getattr(__name__)

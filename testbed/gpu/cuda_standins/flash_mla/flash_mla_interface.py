"""``flash_mla.flash_mla_interface`` stand-in (imported for a type only)."""

from sgl_kernel._stub import StandinNotImplemented, module_getattr


class FlashMLASchedMeta:
    def __init__(self, *args, **kwargs):
        raise StandinNotImplemented("flash_mla.FlashMLASchedMeta is not implemented by the GPU test bed")


__getattr__ = module_getattr(__name__)

"""``IPython.display`` stand-in: only what ``sglang/utils.py`` imports; both raise if used."""

from sgl_kernel._stub import StandinNotImplemented


class HTML:
    def __init__(self, *args, **kwargs):
        raise StandinNotImplemented("IPython.display.HTML is not available on the GPU test bed")


def display(*args, **kwargs):
    raise StandinNotImplemented("IPython.display.display is not available on the GPU test bed")

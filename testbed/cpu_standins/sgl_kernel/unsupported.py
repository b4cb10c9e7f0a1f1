"""Names SGLang may import from `sgl_kernel` on CPU that the stand-in does not implement.

They are plain functions, not `torch.ops.sgl_kernel` entries: SGLang probes that namespace with
`hasattr` to pick fused paths, and those probes must keep answering False.
"""


def _unsupported(name: str, why: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by the CPU test bed's pure-PyTorch stand-in "
            f"(testbed/cpu_standins): {why}"
        )

    op.__name__ = name
    return op


rotate_input_ids_cpu = _unsupported("rotate_input_ids_cpu", "multi-layer EAGLE is not supported")

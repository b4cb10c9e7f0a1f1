"""The tensor inventory of a checkpoint directory: names, dtypes and shapes, from headers only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from draftscope.spec.errors import SpecError
from draftscope.spec.safetensors_header import TensorInfo, read_header, read_tensor

INDEX_NAME = "model.safetensors.index.json"


@dataclass
class Checkpoint:
    """Every tensor of a checkpoint by name: header entries for safetensors; for ``.bin`` files
    the shapes, plus the values of the small vocabulary maps."""

    directory: Path
    files: list[Path]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    bin_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    bin_values: dict[str, np.ndarray] = field(default_factory=dict)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """Shape of tensor ``name``, or None when the checkpoint has no such tensor."""
        if name in self.tensors:
            return self.tensors[name].shape
        return self.bin_shapes.get(name)

    def names(self) -> list[str]:
        return sorted({*self.tensors, *self.bin_shapes})

    def values(self, name: str) -> np.ndarray:
        """Values of one small tensor (``d2t``, ``t2d``); reads only its bytes."""
        if name in self.bin_values:
            return self.bin_values[name]
        return read_tensor(self.tensors[name])


def read_checkpoint(directory: Path, allow_bin: bool = False) -> Checkpoint:
    """Inventory of ``directory``: the safetensors index, else every ``*.safetensors``, else
    ``*.bin`` through ``torch.load(weights_only=True)`` when ``allow_bin``."""
    index = directory / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecError(index, f"is not a valid safetensors index (needs a JSON object with "
                            f"'weight_map'): {exc}.") from exc
        files = sorted({directory / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise SpecError(index, f"lists shard files that are not in the directory: "
                            f"{', '.join(missing)}. Download the missing shards.")
    else:
        files = sorted(directory.glob("*.safetensors"))
    if files:
        ckpt = Checkpoint(directory, files)
        for path in files:
            ckpt.tensors.update(read_header(path))
        return ckpt
    bins = sorted(directory.glob("*.bin"))
    if bins and not allow_bin:
        raise SpecError(bins[0], "is a pickled PyTorch checkpoint and the directory has no "
                        "safetensors file. Convert it to safetensors, or pass --allow-bin to read "
                        "it with torch.load(weights_only=True).")
    if not bins:
        raise SpecError(directory, "holds no weights (no *.safetensors, no "
                        f"{INDEX_NAME}, no *.bin). Point at the draft checkpoint directory.")
    return _read_bin(directory, bins)


def _read_bin(directory: Path, bins: list[Path]) -> Checkpoint:
    import torch  # only for the opt-in .bin path

    ckpt = Checkpoint(directory, bins)
    for path in bins:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # torch raises many types for a bad or unsafe file
            raise SpecError(path, f"cannot be read with torch.load(weights_only=True): {exc}") from exc
        if not isinstance(state, dict):
            raise SpecError(path, "does not hold a state dict (name -> tensor).")
        for name, tensor in state.items():
            ckpt.bin_shapes[name] = tuple(tensor.shape)
            if name.split(".")[-1] in ("d2t", "t2d"):
                ckpt.bin_values[name] = tensor.numpy()
    return ckpt

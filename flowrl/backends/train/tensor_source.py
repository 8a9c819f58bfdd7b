"""Where a converter reads a checkpoint's tensors from: a state dict in memory, or the model's
safetensors files, read slice by slice.

A megatron rank needs only its pipeline stage's layers and, of each tensor-parallel weight, its
own rows or columns. Reading those through ``safe_open(...).get_slice`` (:class:`SafetensorsSource`)
touches only those bytes of the files: a rank's host memory holds its own shard plus one slice in
flight, not the whole model as a ``from_pretrained`` load would (issue 28, "memory that fits real
models"). :class:`StateSource` gives the same interface over a state dict, so the converter has
one code path and its tests compare the two bitwise.

Both return tensors as stored (dtype included): the caller casts when it copies into its own
parameters, as ``copy_`` does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import torch

__all__ = ["SafetensorsSource", "StateSource", "as_source", "chunk_range", "safetensors_source"]


def chunk_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``index`` of ``torch.chunk(t, parts)`` along a dimension of
    ``size``: parts of ``ceil(size / parts)``, the last ones shorter or empty."""
    step = -(-size // parts)
    start = min(size, index * step)
    return start, min(size, start + step)


class StateSource:
    """Slices of the tensors of a state dict (``name -> tensor``) in memory."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state = state

    def __contains__(self, name: str) -> bool:
        return name in self.state

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.state[name].shape)

    def full(self, name: str) -> torch.Tensor:
        return self.state[name]

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.state[name][start:stop]

    def cols(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.state[name][:, start:stop]


class SafetensorsSource:
    """Slices of the tensors of a model's safetensors files (``index``: tensor name -> file, as
    ``flowrl.backends.train.fsdp_load.checkpoint_index`` gives it), each file opened once, only the
    bytes of each slice read. ``reads`` records ``(name, rows or None, cols or None)`` of every
    read, for tests and for accounting what a rank touched."""

    def __init__(self, index: Mapping[str, str]):
        self.index = dict(index)
        self._files: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.reads: list[tuple[str, tuple[int, int] | None, tuple[int, int] | None]] = []
        self.bytes_read = 0  # of tensor data, over every read

    def _read(self, name: str, rows: Any, cols: Any, tensor: torch.Tensor) -> torch.Tensor:
        self.reads.append((name, rows, cols))
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def close(self) -> None:
        self._stack.close()
        self._files.clear()

    def _slice(self, name: str) -> Any:
        path = self.index[name]  # KeyError: the checkpoint lacks the tensor
        handle = self._files.get(path)
        if handle is None:
            from safetensors import safe_open

            handle = self._files[path] = self._stack.enter_context(safe_open(path, framework="pt"))
        return handle.get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def full(self, name: str) -> torch.Tensor:
        sl = self._slice(name)
        return self._read(name, None, None, sl[:] if sl.get_shape() else self._files[self.index[name]].get_tensor(name))

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._read(name, (start, stop), None, self._slice(name)[start:stop])

    def cols(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._read(name, None, (start, stop), self._slice(name)[:, start:stop])


def as_source(state: Any) -> Any:
    """``state`` as a source: a source as it is, a state dict wrapped in :class:`StateSource`."""
    return state if hasattr(state, "rows") and hasattr(state, "cols") else StateSource(state)


@contextlib.contextmanager
def safetensors_source(model_dir: str) -> Iterator[SafetensorsSource | None]:
    """The safetensors source of ``model_dir`` (None when it has no safetensors checkpoint),
    its files closed on exit."""
    from flowrl.backends.train.fsdp_load import checkpoint_index

    index = checkpoint_index(model_dir)
    if not index:
        yield None
        return
    source = SafetensorsSource(index)
    try:
        yield source
    finally:
        source.close()

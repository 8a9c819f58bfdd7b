"""Lets the PyPI torchvision import on CPU torch in the vLLM test environment (copied into its
site-packages with a ``.pth`` line by ``setup_env.sh``; not part of flowrl).

Why: vLLM's ``qwen2_vl.py`` imports transformers' Qwen2-VL image processor module, which imports
``torchvision.transforms.v2`` at its top, so without torchvision vLLM cannot load a Qwen2-VL at
all. PyPI's torchvision for Linux is a CUDA build: its C extension (``_C.so``: nms, roi_align,
image decoding) links ``libc10_cuda.so``, which CPU torch lacks, so it does not load;
torchvision then runs without its C ops (``extension._has_ops()`` is False) except that
``_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and ``::qnms`` without
asking, and ``torch.library.register_fake`` raises "operator torchvision::nms does not exist".

What: just before the first ``import torchvision`` (a meta-path hook, so no process pays for
``import torch`` at start-up), on a CPU build of torch, declare those two operators' schemas (as
torchvision's C++ declares them, no kernel). torchvision's Python then imports; the transforms
the image processors use are plain torch code. Calling ``torchvision.ops.nms`` would still fail
("no kernel"), as it should: nothing here implements it.
"""

from __future__ import annotations

import importlib.abc
import sys

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


class _DeclareBeforeTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        if torch.version.cuda is None:  # CPU torch: torchvision's CUDA-built _C.so cannot load
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in SCHEMAS:
                op = schema.split("(", 1)[0]
                if not hasattr(torch.ops.torchvision, op):
                    lib.define(schema)
            _KEEP.append(lib)  # a Library's definitions last as long as the object
        return None  # the normal finders import torchvision


_KEEP: list = []


def install() -> None:
    if not any(isinstance(f, _DeclareBeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeclareBeforeTorchvision())


install()

"""What the fused Triton kernels share: the optional import, which devices run them, the scalars' table and the
layout of a block of rows."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

try:  # an optional accelerator: the plain torch passes are the fallback everywhere
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with the CUDA wheels of PyTorch
    triton = None

__all__ = ["BLOCK_ROWS", "MAX_K", "SWITCH", "available", "padded_components", "scalar_table", "triton"]

#: Rows per program of a kernel.
BLOCK_ROWS = 128
#: Largest K the kernels serve (their K×K temporaries live in registers).
MAX_K = 16


#: Set to "0" to keep the plain torch passes on CUDA too (the benchmarks compare the two that way).
SWITCH = "ONLINEFA_TRITON"


def available(device: torch.device, k: int) -> bool:
    """Whether the fused kernels run: Triton importable, K ≤ 16, not switched off (``ONLINEFA_TRITON=0``), and a
    CUDA device (or any device under ``TRITON_INTERPRET=1``, the interpreter the tests use)."""
    if triton is None or k > MAX_K or os.environ.get(SWITCH) == "0":
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def padded_components(k: int) -> int:
    """KP: K rounded up to a power of two (at least 2), the width of the kernels' K-sized temporaries."""
    return max(2, 1 << (k - 1).bit_length())


def scalar_table(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """A kernel's scalars as a tensor of the state's dtype on its device: Triton would pass Python floats as
    float32, so a float64 state keeps its step sizes exact only this way."""
    return torch.tensor(list(values), dtype=like.dtype, device=like.device)


if triton is not None:

    @triton.jit
    def block_layout(n_rows, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover - compiled by Triton
        """(program, rows, cols, row_ok, col_ok, row × col mask, K×K mask) of this program's block of rows."""
        pid = tl.program_id(0)
        rows = pid * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, KP)
        row_ok = rows < n_rows
        col_ok = cols < K
        return pid, rows, cols, row_ok, col_ok, row_ok[:, None] & col_ok[None, :], col_ok[:, None] & col_ok[None, :]

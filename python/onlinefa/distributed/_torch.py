"""Helpers for feeding a sharded model from PyTorch training (FSDP2, DDP)."""

from __future__ import annotations

from typing import Any, Iterable


def local_parameter_vector(parameters: Any) -> Any:
    """This rank's parameters, flattened and concatenated in order, without any gather.

    Parameters
    ----------
    parameters : torch.nn.Module or iterable of tensors
        Under FSDP2 (``fully_shard``) the parameters are dim-0-sharded DTensors and each contributes its
        ``to_local()`` shard; plain tensors contribute themselves.

    Returns
    -------
    torch.Tensor
        A detached 1-D tensor on the parameters' device (call ``update`` with it directly: a CPU tensor is
        read in place, any other device is copied to host once). Its length is this rank's ``n_features``.
    """
    import torch

    params: Iterable[Any] = parameters.parameters() if isinstance(parameters, torch.nn.Module) else parameters
    with torch.no_grad():
        pieces = [(p.to_local() if hasattr(p, "to_local") else p).detach().reshape(-1) for p in params]
        if not pieces:
            raise ValueError("no parameters")
        return torch.cat(pieces)


def shard_range(n_features_total: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows [start, stop) of an even contiguous split of ``n_features_total`` rows over the ranks.

    For data-parallel training (DDP), where every rank holds every parameter: rank r fits rows
    ``start:stop`` of the flattened parameter vector; the first ``n % world_size`` ranks get one extra row.
    """
    if not (0 <= rank < world_size) or n_features_total < world_size:
        raise ValueError(f"need 0 <= rank < world_size <= n_features_total, got {rank}, {world_size}, {n_features_total}")
    base, extra = divmod(n_features_total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)

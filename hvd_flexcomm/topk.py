"""Top-k selection by magnitude: pure functions, no communication.

``select_topk(tensor, k)`` returns the indices (int32) of the ``k`` entries of largest absolute value
of a 1-D tensor, **exactly** (the same set ``torch.topk(tensor.abs(), k)`` returns, up to ties), but
usually at a fraction of ``torch.topk``'s cost on large tensors:

1. estimate a magnitude threshold from a random sample of ``|x|`` (8 192 to 65 536 entries), set a
   little below the sample's (1 - k/n) quantile so that, with high probability, at least ``k``
   entries lie above it;
2. one pass over the tensor keeps the candidates ``|x| >= threshold`` (``nonzero``);
3. an exact ``torch.topk`` over the candidates only (about ``k`` of them) trims the set to ``k``;
   for large ``k`` a second, upper threshold from the same sample splits the candidates into
   those certainly kept (above it; if they number at most ``k``) and a narrow band whose
   ``torch.topk`` supplies the rest.

If fewer than ``k`` candidates survive (an unlucky sample), the threshold is lowered and the pass
retried; after ``_MAX_ROUNDS`` misses the exact ``torch.topk`` over the whole tensor is used. The
result is therefore always exact: every entry outside the returned set has a magnitude no larger
than the smallest inside it.

Invariants (tested): ``len(result) == k``; indices are unique, in ``[0, n)``, dtype ``torch.int32``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["TopkWorkspace", "k_for", "select_topk", "sampled_threshold"]

#: Below this many elements a plain ``torch.topk`` is as fast as sampling.
_EXACT_BELOW = 65_536
#: Sample size used to estimate the threshold: n / 400 within [8 192, 65 536] entries. A larger
#: sample gives a tighter threshold (fewer surplus candidates to trim) at a negligible cost.
_SAMPLE_MIN, _SAMPLE_MAX, _SAMPLE_DIVISOR = 8_192, 65_536, 400
#: Attempts with a lowered threshold before falling back to the exact ``torch.topk``.
_MAX_ROUNDS = 3
#: From this many kept entries on, the candidates are trimmed in two bands: those above an upper
#: sampled threshold are kept outright and ``torch.topk`` runs over the narrow band below it only.
_BAND_TRIM_FROM = 50_000


def k_for(cr: float, numel: int) -> int:
    """Number of entries kept for a compression ratio ``cr`` (fraction kept, in (0, 1]).

    ``k = max(1, round(cr * numel))``, clipped to ``numel``; ``0`` for an empty tensor.
    """
    if numel <= 0:
        return 0
    return min(numel, max(1, int(round(cr * numel))))


def sampled_threshold(magnitudes_sample: torch.Tensor, fraction: float) -> float:
    """Magnitude above which roughly ``fraction`` of the population lies, from a sample.

    ``magnitudes_sample`` holds non-negative values; ``fraction`` is in (0, 1]. The threshold is the
    sample's (1 - fraction') quantile, where fraction' adds three binomial standard deviations to
    ``fraction`` so that the true count above it is at least ``fraction * n`` with high probability.
    """
    s = magnitudes_sample.numel()
    sigma = math.sqrt(max(fraction * (1.0 - fraction), 1e-12) / s)
    widened = min(1.0, fraction + 3.0 * sigma + 2.0 / s)
    rank = int(math.floor(widened * s))  # number of sample entries at or above the threshold
    if rank >= s:
        return 0.0
    rank = max(rank, 1)
    # the rank-th largest sample value
    return float(torch.topk(magnitudes_sample, rank, sorted=False).values.min())


class TopkWorkspace:
    """Reusable scratch buffers for :func:`select_topk` (a magnitude buffer and a mask).

    Allocating two model-sized tensors every step costs page faults comparable to the passes
    themselves; a message keeps one workspace for its whole life. Memory: 5 bytes per element for
    float32 input (the magnitudes in the input dtype plus a bool mask).
    """

    __slots__ = ("magnitudes", "mask")

    def __init__(self) -> None:
        self.magnitudes: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    def buffers(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers shaped like ``like`` (reallocated only when its size or dtype changes)."""
        m = self.magnitudes
        if m is None or m.numel() != like.numel() or m.dtype != like.dtype:
            self.magnitudes = torch.empty_like(like)
            self.mask = torch.empty(like.shape, dtype=torch.bool, device=like.device)
        return self.magnitudes, self.mask


def _upper_threshold(magnitudes_sample: torch.Tensor, fraction: float) -> float | None:
    """A magnitude above which, with high probability, *fewer* than ``fraction`` of the population
    lie (the sample's quantile with ``fraction`` narrowed by three binomial standard deviations);
    None when the narrowed fraction leaves no sample entry above it."""
    s = magnitudes_sample.numel()
    sigma = math.sqrt(max(fraction * (1.0 - fraction), 1e-12) / s)
    rank = int(math.floor((fraction - 3.0 * sigma - 2.0 / s) * s))
    if rank < 1:
        return None
    return float(torch.topk(magnitudes_sample, rank, sorted=False).values.min())


def _band_trim(candidates: torch.Tensor, cand_mags: torch.Tensor, k: int,
               upper: float) -> torch.Tensor | None:
    """The ``k`` largest candidates when those above ``upper`` number at most ``k``: they all
    belong, and only the band ``[threshold, upper]`` needs a ``torch.topk``. None otherwise."""
    sure = cand_mags > upper
    n_sure = int(sure.sum())
    if n_sure > k:
        return None
    band = torch.logical_not(sure).nonzero().view(-1)
    pick = torch.topk(cand_mags.index_select(0, band), k - n_sure, sorted=False).indices
    return torch.cat([candidates[sure], candidates.index_select(0, band.index_select(0, pick))])


def _trim(candidates: torch.Tensor, magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest of ``candidates`` (indices into ``magnitudes``), by whichever of
    'keep the k largest' and 'drop the count-k smallest' asks ``torch.topk`` for fewer."""
    count = candidates.numel()
    cand_mags = magnitudes.index_select(0, candidates)
    if k <= count - k:
        return candidates.index_select(0, torch.topk(cand_mags, k, sorted=False).indices)
    drop = torch.topk(cand_mags, count - k, largest=False, sorted=False).indices
    keep = torch.ones(count, dtype=torch.bool, device=candidates.device)
    keep[drop] = False
    return candidates[keep]


def select_topk(
    tensor: torch.Tensor,
    k: int,
    generator: torch.Generator | None = None,
    workspace: TopkWorkspace | None = None,
) -> torch.Tensor:
    """Indices (int32, unordered) of the ``k`` largest-magnitude entries of a 1-D tensor.

    ``generator`` seeds the threshold sample (pass one for reproducible runs); ``workspace``
    provides reusable scratch buffers. NaN entries count as larger than any number (as in
    ``torch.topk``) only on the exact fallback path; callers that care about non-finite
    gradients must check for them separately.
    """
    if tensor.dim() != 1:
        raise ValueError(f"select_topk expects a 1-D tensor, got shape {tuple(tensor.shape)}")
    n = tensor.numel()
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    if k == 0:
        return torch.empty(0, dtype=torch.int32, device=tensor.device)
    if k == n:
        return torch.arange(n, dtype=torch.int32, device=tensor.device)
    if n < _EXACT_BELOW or k * 4 > n:
        return torch.topk(tensor.abs(), k, sorted=False).indices.to(torch.int32)

    sample_size = min(_SAMPLE_MAX, max(_SAMPLE_MIN, n // _SAMPLE_DIVISOR))
    sample_idx = torch.randint(0, n, (sample_size,), generator=generator, device=tensor.device)
    sample = tensor.index_select(0, sample_idx).abs_()
    fraction = k / n
    if workspace is None:
        workspace = TopkWorkspace()
    magnitudes, mask = workspace.buffers(tensor)
    torch.abs(tensor, out=magnitudes)
    upper = _upper_threshold(sample, fraction) if k >= _BAND_TRIM_FROM else None
    for _ in range(_MAX_ROUNDS):
        threshold = sampled_threshold(sample, fraction)
        torch.ge(magnitudes, threshold, out=mask)
        candidates = torch.nonzero(mask).view(-1)
        count = candidates.numel()
        if count >= k:
            if count == k:
                return candidates.to(torch.int32)
            if upper is not None and upper >= threshold:
                chosen = _band_trim(candidates, magnitudes.index_select(0, candidates), k, upper)
                if chosen is not None:
                    return chosen.to(torch.int32)
            return _trim(candidates, magnitudes, k).to(torch.int32)
        fraction = min(1.0, fraction * 2.0)
    return torch.topk(magnitudes, k, sorted=False).indices.to(torch.int32)

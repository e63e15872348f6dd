"""``torchkm.nn``: vector-quantization layers for training loops, on torchkm's kernels.

:class:`VectorQuantizer` maps every vector of its input to the nearest of ``num_codes`` codebook
vectors, with straight-through gradients, and keeps its codebook up to date while it trains:

- codebook state lives in buffers (``codebook``, ``cluster_size``, ``embed_sum``), so
  ``state_dict`` saves and resumes training exactly;
- the codebook starts from a k-means fit (torchkm's own) of the first training batch(es);
- each training step finds the nearest codes and the per-code sums of the batch in one fused pass on
  CUDA (never a batch x codes distance matrix), then moves the codebook by exponential moving
  averages with Laplace smoothing (the same update as ``KMeans.partial_fit``, with a decay);
- codes whose average usage falls below ``dead_code_threshold`` are moved onto random batch vectors;
- under ``torch.distributed`` the per-code statistics are all-reduced in one collective per step, so
  every rank holds the same codebook;
- nothing in the training step synchronises with the host, and ``torch.compile(fullgraph=True)``
  traces it whole once the codebook is initialised.

:class:`ResidualVQ` chains several quantizers on successive residuals.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import _online, _ops
from ._distributed import Comm
from ._loop import fit as _kmeans_fit
from ._validation import check_precision

__all__ = ["ResidualVQ", "VQLosses", "VQOutput", "VectorQuantizer", "perplexity"]

logger = logging.getLogger("torchkm")

_METRICS = ("euclidean", "cosine")


class VQOutput(NamedTuple):
    """What a quantizer's forward returns; unpacks as ``quantized, indices, loss``."""

    quantized: torch.Tensor  # like the input (same shape and dtype), straight-through gradients
    indices: torch.Tensor  # int64, the input's shape without its last dimension (plus quantizers for RVQ)
    loss: torch.Tensor  # 0-d float32: commitment_weight * commitment + codebook loss


class VQLosses(NamedTuple):
    """The terms of ``VQOutput.loss``, unweighted (``return_loss_breakdown=True``)."""

    commitment: torch.Tensor  # mean squared distance of inputs to their (detached) codes
    codebook: torch.Tensor  # mean squared distance of codes to the (detached) inputs; 0 unless learned


def perplexity(counts_or_indices: torch.Tensor, num_codes: int | None = None) -> torch.Tensor:
    """Perplexity ``exp(entropy)`` of code usage: ``num_codes`` when all codes are used equally, 1 when
    one code takes everything.

    Pass per-code counts (float, shape (num_codes,)), e.g. a quantizer's ``cluster_size``, or integer
    indices together with ``num_codes``.
    """
    if not counts_or_indices.is_floating_point():
        if num_codes is None:
            raise ValueError("pass num_codes along with integer indices")
        idx = counts_or_indices.reshape(-1)
        counts = torch.zeros(num_codes, dtype=torch.float32, device=idx.device)
        counts.scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
    else:
        counts = counts_or_indices.float()
    p = counts / counts.sum().clamp_min(1e-30)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-30))).sum())


class _Quantize(torch.autograd.Function):
    """The quantized output, the commitment loss and the weighted loss of a batch, with their
    gradients to the input.

    ``quantized`` is the codes ``codebook[labels]`` in the input's dtype, with the identity as its
    gradient (straight through); ``commitment`` is ``mean ||x - sg(code)||^2``, ``loss`` is
    ``loss_weight * commitment``. Their values come from the assignment's per-row squared distances
    (computed from the difference, in fp32; or their 0-d sum). On CUDA the forward is one kernel
    (the codes in the input's dtype, and in fp32 for the backward of 16-bit inputs, and both loss
    scalars), and the backward one expression,
    ``g_quantized + (g_commitment + loss_weight g_loss) * 2 (x - code) / x.numel()``, one kernel
    too: the usual ``x + (code - x).detach()`` and ``mse_loss`` take four more passes over the batch
    forward and two more backward, which a training step at VQ sizes notices.
    """

    @staticmethod
    def forward(ctx, flat: torch.Tensor, labels: torch.Tensor, codebook: torch.Tensor, sq_distances: torch.Tensor,
                loss_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        total = sq_distances if sq_distances.dim() == 0 else sq_distances.sum(dtype=torch.float32)
        codes, codes32, commitment, loss = _ops.gather_codes(labels, codebook, flat.dtype, total,
                                                             1.0 / max(flat.numel(), 1), loss_weight)
        ctx.save_for_backward(flat, codes32)
        ctx.loss_weight = loss_weight
        # Unused outputs' gradients stay None (usually the commitment's): no zeros launched for them.
        ctx.set_materialize_grads(False)
        return codes, commitment, loss

    @staticmethod
    def backward(ctx, grad_quantized: torch.Tensor | None, grad_commitment: torch.Tensor | None,
                 grad_loss: torch.Tensor | None):
        if not ctx.needs_input_grad[0] or (grad_quantized is None and grad_commitment is None and grad_loss is None):
            return None, None, None, None, None
        flat, codes = ctx.saved_tensors
        if grad_quantized is None:
            grad_quantized = torch.zeros_like(flat)
        grad = _ops.straight_through_grad(grad_quantized, flat, codes, grad_commitment, grad_loss, ctx.loss_weight)
        return grad, None, None, None, None


class _ReplayedSteps:
    """A layer's eager training step on CUDA (assignment with sums, loss sum, EMA update, dead-code
    revival) replayed as a CUDA graph, per input shape, from the shape's second step on.

    An eager step launches some twenty kernels and is bound by host time (H200, 32,768 x 256,
    8192 codes: 1.4-2.0 ms a step against about 0.7 ms of GPU work). A replay launches the graph,
    which reads the batch in place where it lies at the address the graph was captured with, and
    otherwise a second graph's copy of it; the codes are then gathered from the graph's copy of
    the codebook as it was before the update. Kept for the last
    ``MAX_SHAPES`` keys: shape, dtype, strides, device and stream of the batch, the addresses of
    the codebook's buffers (a moved or replaced buffer makes a new key), the layer's settings,
    inference mode and the ``TORCHKM_*`` environment. Each holds the graph's memory pool and a copy
    of the codebook, and, once a batch comes at another address than the one the key's graph
    reads in place, a second graph with a copy of its batch: 56 MiB for one graph at 32,768 x 256
    with 8192 codes (H200, 2026-11-22, with the copy). Dead-code revival draws from torch's CUDA
    generator, which replays advance as eager steps would. ``TORCHKM_REPLAY_QUERIES=0`` turns replays off; :func:`torchkm.empty_cache`
    frees them.
    """

    MAX_SHAPES = 2

    def __init__(self) -> None:
        # None: the key's first step ran eagerly (the kernels compile); then its two
        # ``ReplayedCall``s: one reading the batch in place (while batches come at the address of the
        # one it was captured with: a training loop's activations mostly do, and a benchmark's
        # always), saving a copy of the batch per step (18 us of 0.57 ms for fp32 32,768 x 256
        # on an H200); the other copying it in, for batches elsewhere.
        self.entries: dict[tuple, Any] = {}

    def clear(self) -> None:
        self.entries.clear()

    def __deepcopy__(self, memo: dict) -> _ReplayedSteps:
        return _ReplayedSteps()  # graphs refer to this layer's buffers: a copy captures its own

    def __reduce__(self) -> tuple:
        return _ReplayedSteps, ()

    def key(self, layer: VectorQuantizer, flat: torch.Tensor) -> tuple:
        buffers = tuple(t.data_ptr() for t in (layer.codebook, layer.cluster_size, layer.embed_sum))
        return (tuple(flat.shape), flat.dtype, tuple(flat.stride()), flat.data_ptr() % 16, flat.device,
                torch.cuda.current_stream(flat.device).cuda_stream, buffers, layer.precision, layer.metric,
                layer.decay, layer.eps, layer.dead_code_threshold, torch.is_inference_mode_enabled(), _ops.settings())

    def __call__(self, layer: VectorQuantizer, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(labels, codebook, sq_total)`` of a replayed step: a copy of its labels, and the graph's
        copy of the codebook they index and its sum of squared distances (both read before the next
        replay), or None where this step must run eagerly (the key's first, or a failed capture)."""
        key = self.key(layer, flat)
        seen = key in self.entries
        call = self.entries.pop(key, None)
        if seen and call is None:
            call = (_ops.replayed_call(self, aliased=True), _ops.replayed_call(self))
        self.entries[key] = call
        while len(self.entries) > self.MAX_SHAPES:
            self.entries.pop(next(iter(self.entries)))
        if call is None:
            return None
        in_place, copying = call
        outputs = in_place(lambda inputs: layer._step_on(inputs["flat"]), {"flat": flat}, flat.device)
        if outputs is None:
            outputs = copying(lambda static: layer._step_on(static["flat"]), {"flat": flat}, flat.device)
        if outputs is None:
            return None
        labels, codebook, sq_total = outputs
        return labels.clone(), codebook, sq_total


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


class VectorQuantizer(nn.Module):
    """Vector quantization with a k-means codebook (VQ-VAE, audio/image tokenizers).

    ``forward(x)`` takes any tensor whose last dimension is ``dim`` (``(B, ..., dim)``) and returns
    :class:`VQOutput` ``(quantized, indices, loss)``: the nearest code of every vector (same shape and
    dtype as ``x``; its gradient passes straight through to ``x``), the code indices (int64, shape
    ``x.shape[:-1]``), and the loss to add to the model's (0-d float32).

    Args:
        num_codes: codebook size k.
        dim: vector dimension (the input's last dimension).
        metric: ``"euclidean"`` (default) or ``"cosine"``: inputs and codes are L2-normalised and the
            quantized output is the unit code (as in vector-quantize-pytorch's ``use_cosine_sim``).
        commitment_weight: weight of the commitment loss ``mean ||x - sg(code)||^2`` (VQ-VAE's beta).
        learnable_codebook: ``False`` (default): the codebook moves by exponential moving averages of
            the vectors assigned to each code and receives no gradient. ``True``: the codebook is an
            ``nn.Parameter`` trained by your optimizer through the codebook loss
            ``mean ||sg(x) - code||^2`` (added to ``loss`` with weight 1); no EMA.
        decay: EMA decay of the code sizes and sums (VQ-VAE: 0.99).
        eps: Laplace smoothing of the code sizes in the EMA update.
        kmeans_init: start the codebook from a k-means fit (``init="auto"``: k-means++, or
            k-means|| for large pools; ``kmeans_iters`` Lloyd iterations) of the first training batch; batches are pooled until there are at least
            ``num_codes`` vectors. ``False``: a random uniform codebook (Kaiming-style bounds).
        kmeans_iters: Lloyd iterations of that fit.
        dead_code_threshold: codes whose EMA size (vectors per step) falls below this are moved onto
            random vectors of the current batch, with size reset to the threshold. 0 disables it.
        precision: assignment precision on CUDA, as in :func:`torchkm.assign`: ``"exact"`` (the
            labels of an fp32 computation) or ``"fast"`` (tensor-core pass alone).
        sync_codebook: all-reduce codebook statistics over ``torch.distributed`` ranks. ``None``
            (default): whenever a process group of more than one rank is initialised.
        seed: seed of the k-means initialisation (``None``: torch's global RNG). Dead-code
            replacement draws from torch's global RNG on the input's device.

    Buffers (all in ``state_dict``): ``codebook`` (k, dim) float32 (a parameter when learned),
    ``cluster_size`` (k,) EMA of vectors per code and step, ``embed_sum`` (k, dim) EMA of their sums
    (EMA codebooks only), and ``initialized``.

    A training batch with a NaN or Inf (or whose sums overflow) updates nothing: the codebook and
    its statistics stay as they were (decided on the device, no host sync), its loss is not finite.

    Under ``torch.autocast`` the input may arrive in bf16/fp16: the assignment runs on it as it is
    (bf16/fp16 tensor-core products on CUDA), while the codebook, its statistics and the losses stay
    in float32, and ``quantized`` comes back in the input's dtype.

    ``torch.compile(vq, fullgraph=True)`` traces the whole forward once the codebook is initialised:
    run the first training step eagerly (or call :meth:`initialize`) before compiling.

    Example:
        >>> import torch, torchkm
        >>> vq = torchkm.nn.VectorQuantizer(512, 64)
        >>> z = torch.randn(8, 16, 16, 64, requires_grad=True)
        >>> quantized, indices, loss = vq(z)
        >>> quantized.shape, indices.shape
        (torch.Size([8, 16, 16, 64]), torch.Size([8, 16, 16]))
    """

    codebook: torch.Tensor
    cluster_size: torch.Tensor
    initialized: torch.Tensor

    def __init__(
        self,
        num_codes: int,
        dim: int,
        *,
        metric: str = "euclidean",
        commitment_weight: float = 0.25,
        learnable_codebook: bool = False,
        decay: float = 0.99,
        eps: float = 1e-5,
        kmeans_init: bool = True,
        kmeans_iters: int = 10,
        dead_code_threshold: float = 0.0,
        precision: str = "exact",
        sync_codebook: bool | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("num_codes", num_codes), ("dim", dim), ("kmeans_iters", kmeans_iters)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if metric not in _METRICS:
            raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay!r}")
        if eps < 0 or commitment_weight < 0 or dead_code_threshold < 0:
            raise ValueError("eps, commitment_weight and dead_code_threshold must be >= 0, got "
                             f"{eps!r}, {commitment_weight!r}, {dead_code_threshold!r}")
        self.num_codes = num_codes
        self.dim = dim
        self.metric = metric
        self.commitment_weight = float(commitment_weight)
        self.learnable_codebook = learnable_codebook
        self.decay = float(decay)
        self.eps = float(eps)
        self.kmeans_init = kmeans_init
        self.kmeans_iters = kmeans_iters
        self.dead_code_threshold = float(dead_code_threshold)
        self.precision = check_precision(precision)
        self.sync_codebook = sync_codebook
        self.seed = seed

        bound = math.sqrt(3.0 / dim)  # uniform with unit-variance-per-vector scale, as kaiming_uniform
        codebook = torch.empty(num_codes, dim).uniform_(-bound, bound)
        if metric == "cosine":
            codebook = F.normalize(codebook, dim=1)
        if learnable_codebook:
            self.codebook = nn.Parameter(codebook)  # type: ignore[assignment]
        else:
            self.register_buffer("codebook", codebook)
            self.register_buffer("embed_sum", codebook.clone())
        self.register_buffer("cluster_size", torch.ones(num_codes))
        self.register_buffer("initialized", torch.tensor(not kmeans_init))
        # A Python mirror of `initialized`: torch.compile guards on it instead of reading the device.
        self._initialized = not kmeans_init
        self._pending: list[torch.Tensor] = []
        self._replayed = _ReplayedSteps()

    # -- codebook ---------------------------------------------------------------------------------

    def _sync(self) -> bool:
        return self.sync_codebook is not False and _distributed()

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> bool:
        """Fit the codebook to the vectors of ``x`` (shape ``(..., dim)``) by k-means, pooling them
        with earlier calls' until there are ``num_codes`` of them (over all ranks when synced).
        Returns whether the codebook is now initialised. ``forward`` calls this on training batches
        while ``kmeans_init`` is pending."""
        if self._initialized:
            return True
        flat = self._prepare(x).detach().float()
        self._pending.append(flat)
        pooled = torch.cat(self._pending)
        sync = self._sync()
        if sync:
            pooled = Comm(torch.distributed.group.WORLD).gather_rows(pooled)
        if pooled.shape[0] < self.num_codes:
            logger.info("VectorQuantizer: %d of %d vectors pooled for the k-means initialisation",
                        pooled.shape[0], self.num_codes)
            return False
        codebook = torch.empty(self.num_codes, self.dim, device=flat.device)
        sizes = torch.empty(self.num_codes, device=flat.device)
        if not sync or torch.distributed.get_rank() == 0:
            result = _kmeans_fit(pooled, self.num_codes, max_iter=self.kmeans_iters, metric=self.metric,
                                 random_state=self.seed, precision=self.precision)
            codebook.copy_(result.centroids)
            sizes.zero_().scatter_add_(0, result.labels, torch.ones_like(result.labels, dtype=sizes.dtype))
            # Per-step sizes: the pooled batches stand for this many training steps.
            sizes /= len(self._pending)
        if sync:
            torch.distributed.broadcast(codebook, 0)
            torch.distributed.broadcast(sizes, 0)
        self.codebook.copy_(codebook)
        self.cluster_size.copy_(sizes)
        if not self.learnable_codebook:
            self.embed_sum.copy_(codebook * sizes.unsqueeze(1))
        self.initialized.fill_(True)
        self._initialized = True
        self._pending = []
        return True

    @torch.no_grad()
    def _update(self, flat: torch.Tensor, labels: torch.Tensor, sums: torch.Tensor | None, counts: torch.Tensor) -> None:
        """Fold one training batch into the codebook: EMA statistics, then dead-code replacement."""
        k = self.num_codes
        revive = self.dead_code_threshold > 0 and flat.shape[0] > 0
        candidates = None
        if revive:
            candidates = flat[torch.randint(0, flat.shape[0], (k,), device=flat.device)].float()
        if self._sync():
            # One collective per step: sums, counts and replacement candidates packed together. Each
            # rank offers candidates for the codes it owns (code % world == rank), so the sum holds
            # one real batch vector per code and every rank revives with the same vectors.
            parts = [counts.unsqueeze(1)]
            if sums is not None:
                parts.append(sums)
            if candidates is not None:
                owned = torch.arange(k, device=flat.device) % torch.distributed.get_world_size()
                parts.append(candidates * (owned == torch.distributed.get_rank()).unsqueeze(1))
            packed = torch.cat(parts, dim=1)
            torch.distributed.all_reduce(packed)
            counts = packed[:, 0]
            col = 1
            if sums is not None:
                sums, col = packed[:, 1 : 1 + self.dim], 1 + self.dim
            if candidates is not None:
                candidates = packed[:, col:]
        # A batch with a non-finite row (NaN or Inf in x, or its sums overflowing: after the
        # all-reduce, on any rank) updates nothing, on the device: one bad step (AMP's Inf
        # activations, which its scaler skips) must not poison the codebook for every later one.
        # Its labels are arbitrary and its loss is not finite, which is how the caller sees it.
        # (The counts, of labels, are always finite.)
        apply = None if sums is None else torch.isfinite(sums).all()
        embed_sum = None if self.learnable_codebook else self.embed_sum
        _online.accumulate(self.cluster_size, embed_sum, counts, sums, self.decay, apply)
        if embed_sum is not None:
            moved = _online.centroids_from_stats(
                embed_sum, self.cluster_size, self.codebook, normalize=self.metric == "cosine", smoothing=self.eps)
            self.codebook.copy_(moved if apply is None else torch.where(apply, moved, self.codebook))
        if candidates is not None:
            # (A learned codebook's batch sums nothing: its non-finite rows are kept from becoming codes.)
            revive = torch.isfinite(candidates).all()
            if apply is not None:
                revive = revive & apply
            dead = (self.cluster_size < self.dead_code_threshold) & revive
            _online.replace_dead(dead, candidates, self.codebook, self.cluster_size, embed_sum,
                                 self.dead_code_threshold)

    @torch.no_grad()
    def _step_on(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The GPU work of an EMA training step on detached rows (what ``_ReplayedSteps`` captures):
        labels, a copy of the codebook they index (the update then moves the codebook), and the sum
        of squared distances. On the kernels that is the assignment pass and two update launches
        (``_ops.assign_and_ema_update``), instead of some twenty torch launches."""
        if _ops.ema_step_fuses(flat):
            return _ops.assign_and_ema_update(
                flat, self.codebook, self.cluster_size, self.embed_sum, precision=self.precision, decay=self.decay,
                eps=self.eps, normalize=self.metric == "cosine", dead_threshold=self.dead_code_threshold)
        codebook = self.codebook.detach()
        labels, sq_distances, sums, counts = _ops.query_assign_and_sum(flat, codebook, self.precision)
        used = codebook.clone()
        sq_total = sq_distances.sum(dtype=torch.float32)
        self._update(flat, labels, sums, counts)
        return labels, used, sq_total

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The code vectors (float32, ``indices.shape + (dim,)``) of integer ``indices``."""
        if indices.is_floating_point() or indices.is_complex():
            raise TypeError(f"indices must be an integer tensor, got {indices.dtype}")
        return F.embedding(indices.long(), self.codebook)

    @property
    def dead_codes(self) -> torch.Tensor:
        """Number of codes whose EMA size is below ``dead_code_threshold`` (below 1e-3 when it is 0)."""
        return (self.cluster_size < (self.dead_code_threshold or 1e-3)).sum()

    # -- forward ----------------------------------------------------------------------------------

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., {self.dim}), got {tuple(x.shape)}")
        flat = x.reshape(-1, self.dim)
        return F.normalize(flat, dim=1) if self.metric == "cosine" else flat

    def forward(self, x: torch.Tensor, *, return_loss_breakdown: bool = False) -> Any:
        """Quantize ``x`` (``(..., dim)``); in training mode also update the codebook.

        Returns :class:`VQOutput`, or ``(VQOutput, VQLosses)`` with ``return_loss_breakdown=True``.
        """
        if self.training and not self._initialized:
            self.initialize(x)
        flat = self._prepare(x)
        with torch.autocast(flat.device.type, enabled=False):
            codebook = self.codebook
            detached = flat.detach()
            update = self.training and flat.shape[0] > 0
            stepped = None  # (labels, codebook they index, sq total) of a step that updated the codebook
            if update and not self.learnable_codebook and self._initialized:
                if not self._sync():
                    if _ops.replays_enabled(detached):
                        stepped = self._replayed(self, detached)
                    if stepped is None and _ops.ema_step_fuses(detached):
                        stepped = self._step_on(detached)
                if stepped is None:
                    labels, sq_distances, sums, counts = _ops.query_assign_and_sum(detached, codebook.detach(),
                                                                                   self.precision)
            else:
                labels, sq_distances = _ops.query_assign(detached, codebook.detach(), "euclidean", self.precision)
                sums = counts = None
                if update:  # usage statistics of a learned codebook (dead-code revival)
                    counts = torch.zeros(self.num_codes, device=flat.device).scatter_add_(
                        0, labels, torch.ones_like(labels, dtype=torch.float32))
            if stepped is not None:  # the codebook has moved: the codes come from its copy
                labels, codebook_used, sq_distances = stepped
                counts = None
            else:
                codebook_used = codebook.detach()
            quantized, commitment, loss = _Quantize.apply(flat, labels, codebook_used, sq_distances,
                                                          self.commitment_weight)
            codebook_loss = None
            if self.learnable_codebook and flat.shape[0]:
                # The codes again, this time carrying the codebook's gradient.
                codebook_loss = F.mse_loss(F.embedding(labels, codebook), detached.float())
                loss = loss + codebook_loss
            if counts is not None and self._initialized:
                self._update(detached, labels, sums, counts)
        out = VQOutput(quantized.reshape(x.shape), labels.reshape(x.shape[:-1]), loss)
        if not return_loss_breakdown:
            return out
        return out, VQLosses(commitment, torch.zeros((), device=flat.device) if codebook_loss is None else codebook_loss)

    # -- state ------------------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # type: ignore[override]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self._initialized = bool(self.initialized)
        self._pending = []

    def extra_repr(self) -> str:
        mode = "learned" if self.learnable_codebook else f"ema decay={self.decay}"
        return f"num_codes={self.num_codes}, dim={self.dim}, metric={self.metric!r}, {mode}"


class ResidualVQ(nn.Module):
    """Residual vector quantization: ``num_quantizers`` :class:`VectorQuantizer` layers, each
    quantizing what the previous ones left (SoundStream, EnCodec).

    ``forward(x)`` returns :class:`VQOutput` with ``quantized`` the sum of the chosen codes (gradient
    straight through to ``x``), ``indices`` of shape ``x.shape[:-1] + (num_quantizers,)`` and
    ``loss`` the sum of the layers' losses (each layer's commitment is to its own residual).
    Keyword arguments go to every layer (``seed`` is offset by the layer's position).
    """

    def __init__(self, num_quantizers: int, num_codes: int, dim: int, **kwargs: Any) -> None:
        super().__init__()
        if isinstance(num_quantizers, bool) or not isinstance(num_quantizers, int) or num_quantizers < 1:
            raise ValueError(f"num_quantizers must be a positive int, got {num_quantizers!r}")
        seed = kwargs.pop("seed", None)
        self.layers = nn.ModuleList(
            VectorQuantizer(num_codes, dim, seed=None if seed is None else seed + i, **kwargs) for i in range(num_quantizers)
        )

    def forward(self, x: torch.Tensor, *, return_loss_breakdown: bool = False) -> Any:
        residual = x
        total = torch.zeros_like(x)
        indices, losses, commitments, codebook_losses = [], [], [], []
        for layer in self.layers:
            out, parts = layer(residual, return_loss_breakdown=True)
            code = out.quantized.detach()
            total = total + code
            residual = residual - code
            indices.append(out.indices)
            losses.append(out.loss)
            commitments.append(parts.commitment)
            codebook_losses.append(parts.codebook)
        quantized = x + (total - x).detach()
        out = VQOutput(quantized, torch.stack(indices, dim=-1), torch.stack(losses).sum())
        if return_loss_breakdown:
            return out, VQLosses(torch.stack(commitments).sum(), torch.stack(codebook_losses).sum())
        return out

    def get_codes_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Per-layer codes, ``indices.shape + (dim,)``, of ``indices`` shaped ``(..., num_quantizers)``."""
        if indices.shape[-1] != len(self.layers):
            raise ValueError(f"indices must end in a dimension of {len(self.layers)} quantizers, got {tuple(indices.shape)}")
        return torch.stack([layer.get_codes_from_indices(indices[..., i]) for i, layer in enumerate(self.layers)], dim=-2)

    def get_output_from_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The quantized vectors (sum over the layers' codes) of ``indices`` ``(..., num_quantizers)``."""
        return self.get_codes_from_indices(indices).sum(dim=-2)

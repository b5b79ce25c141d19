"""A lean token-by-token decoding loop for Llama-style models with LoRA adapters.

transformers' ``generate()`` runs every decoding step through the full module stack: peft's
adapter layers (two small products, a dtype cast, a scaling and an add for each of the 7
adapted projections of a layer; under mixed precision autocast also casts every fp32 LoRA
weight to bf16, at every step), the mask builders, the logits processors and the stopping
criteria. At batch 1 on a CPU core that put the step at 2.2x the time of the model's matrix
products alone (docs/performance.md). :class:`LeanDecoder` runs a step as the products plus
the few elementwise operations a Llama layer needs:

- the adapters' weights are prepared once per weight version (``Tensor._version``, bumped by
  every optimizer step), with the scaling folded into ``B`` and the ``A`` matrices of
  projections that read the same input stacked (q, k, v; gate, up), so a layer runs 8 small
  products instead of 14 and casts no weight; under mixed precision they run in fp32 or in
  the autocast dtype, whichever was measured faster on the machine (:func:`_choice`);
- keys and values are written into the generation's cache in place (a
  :func:`~textgym_agents.decoding.shared_prefix.growing_cache`), and the attention of the one
  new query is torch's kernel or :func:`one_query_attention`, whichever was measured faster
  (each choice made once per machine and kept, so every run on it samples alike);
- sampling is temperature, top-k and top-p as transformers applies them, then one
  ``torch.multinomial`` draw (or the argmax), on float32 logits.

The prompt's own pass still runs through the model (hooks such as the critic's see it) and
the loop takes over from the first sampled token. Results agree with ``generate()`` to
rounding, not bit for bit (products are stacked differently); training never uses a reply's
generation-time numerics (old log-probs come from scoring passes).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CLEARLY_FASTER",
    "SUPPORTED_MODEL_TYPES",
    "LeanDecoder",
    "decode_rows",
    "lean_decoder",
    "one_query_attention",
    "sample_next",
    "warp",
]

SUPPORTED_MODEL_TYPES = frozenset({"llama"})
"""``config.model_type`` values whose decoder layers :class:`LeanDecoder` runs itself."""

_DECODERS: weakref.WeakKeyDictionary[nn.Module, LeanDecoder | None] = weakref.WeakKeyDictionary()


@dataclass
class _Projection:
    """One or more projections reading the same input: base weights, stacked adapter."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    a: torch.Tensor | None = None  # (sum of ranks, in), stacked over projections and adapters
    b: torch.Tensor | None = None  # (sum of outs, sum of ranks), block-diagonal, scaling folded

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [F.linear(x, w, bias) for w, bias in zip(self.weights, self.biases, strict=True)]
        if self.a is None:
            return outs
        delta = F.linear(F.linear(x.to(self.a.dtype), self.a), self.b)  # type: ignore[arg-type]
        start = 0
        for out in outs:  # the sum in the wider dtype, rounded to the output's
            out.add_(delta[..., start : start + out.shape[-1]])
            start += out.shape[-1]
        return outs


@dataclass
class _Layer:
    norm1: tuple[torch.Tensor, float]
    qkv: _Projection
    o: _Projection
    norm2: tuple[torch.Tensor, float]
    gate_up: _Projection
    down: _Projection


class LeanDecoder:
    """Decoding steps of one Llama-style causal LM, its LoRA adapters included.

    The model is the base model of a ``PeftModel`` (or one without adapters). Build it with
    :func:`lean_decoder`, which returns None for models it does not cover.
    :meth:`step` runs one new token per row over a cache that holds every earlier column.

    Example:
        >>> from textgym_agents.model.adapters import attach_lora
        >>> from textgym_agents.testing import tiny_model
        >>> model = attach_lora(tiny_model()[0]).eval()
        >>> decoder = lean_decoder(model)
        >>> ids = torch.tensor([[5, 6, 7, 8]])
        >>> with torch.no_grad():
        ...     full = model(input_ids=ids).logits[:, -1]
        ...     cache = model(input_ids=ids[:, :3], use_cache=True).past_key_values
        ...     step = decoder.step(ids[:, 3], torch.tensor([3]), cache, None)
        >>> torch.allclose(full, step, atol=1e-5)
        True
    """

    def __init__(self, causal_lm: nn.Module) -> None:
        self.lm = causal_lm
        config = causal_lm.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.act: Callable[[torch.Tensor], torch.Tensor] = (
            F.silu if config.hidden_act == "silu" else causal_lm.model.layers[0].mlp.act_fn
        )
        self._key: tuple[Any, ...] | None = None
        self._lora_choice: dict[torch.dtype, torch.dtype | None] = {}
        self._attend: Callable[..., torch.Tensor] | None = None
        self._layers: list[_Layer] = []

    def _weights_key(self, dtype: torch.dtype, lora_dtype: torch.dtype | None) -> tuple[Any, ...]:
        parts: list[Any] = [dtype, lora_dtype]
        for module in self.lm.modules():
            if hasattr(module, "lora_A"):
                parts.append(tuple(_adapters(module)))
                for name in _adapters(module):
                    for weight in (module.lora_A[name].weight, module.lora_B[name].weight):
                        parts.append((id(weight), weight._version))
        return tuple(parts)

    def in_weights_dtype(self) -> bool:
        """Whether a step now runs in the weights' dtype (no autocast to another dtype)."""
        weight = self.lm.get_input_embeddings().weight
        device = weight.device.type
        on = torch.is_autocast_enabled(device)
        return not on or torch.get_autocast_dtype(device) == weight.dtype

    def prepare(self) -> None:
        """Prepare the layers' weights for the model as it is now (after each weight change).

        The adapters' products run in the autocast dtype where autocast is on (mixed
        precision), else in their weights' dtype, as peft runs them. Cheap when nothing changed.
        """
        device = self.lm.get_input_embeddings().weight.device.type
        lora_dtype = None  # the adapters' own dtype, as peft runs them
        if torch.is_autocast_enabled(device):  # mixed precision: the faster of the two
            lora_dtype = self._lora_dtype(torch.get_autocast_dtype(device))
        key = self._weights_key(self.lm.get_input_embeddings().weight.dtype, lora_dtype)
        if key != self._key:
            self._layers = [self._layer(layer, lora_dtype) for layer in self.lm.model.layers]
            self._key = key

    def _lora_dtype(self, autocast: torch.dtype) -> torch.dtype | None:
        """``autocast`` where the adapter products run clearly faster in it, else None (theirs).

        Measured once per machine (:func:`_choice`) on the first layer's stacked q/k/v adapter
        at batch 1 and 8 (on one CPU core with AVX-512 BF16 the fp32 pair took 15 µs, the bf16
        pair 40 µs, at batch 1: small bf16 products pay a fixed dispatch cost).
        """
        if autocast not in self._lora_choice:
            found = self._layer(self.lm.model.layers[0], None).qkv
            if found.a is None:
                self._lora_choice[autocast] = None
            else:
                a, b = found.a, found.b
                assert b is not None
                name = (
                    f"decode adapters {_where(a.device)} {a.dtype} -> {autocast}, "
                    f"{tuple(a.shape)} x {tuple(b.shape)}"
                )
                chosen = _choice(
                    name, lambda: (_time_pair(a, b), _time_pair(a.to(autocast), b.to(autocast)))
                )
                self._lora_choice[autocast] = autocast if chosen else None
        return self._lora_choice[autocast]

    def _attention(self, like: torch.Tensor) -> Callable[..., torch.Tensor]:
        """The attention for one query per row here, measured once per machine (:func:`_choice`).

        torch's ``scaled_dot_product_attention``, or :func:`one_query_attention` (two
        products, the softmax in float32) where it is clearly faster, timed at batch 8 over
        256 keys in the weights' dtype, the keys a view of a longer buffer as in the
        generation cache. On one CPU core with AVX-512 BF16, in bf16, over 512 keys: 4.1 ms
        against 0.5 ms a layer (the flash kernel is slow at one query); in float32 about even.
        """
        scale = self.head_dim**-0.5

        def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scale, enable_gqa=True
            )

        def products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
            return one_query_attention(q, k, v, mask, scale)

        def timings() -> tuple[float, float]:  # only where this machine has not chosen yet
            def make(heads: int, length: int) -> torch.Tensor:
                return _noise((8, heads, length, self.head_dim), like)

            q = make(self.heads, 1)
            k, v = make(self.kv_heads, 288)[:, :, :256], make(self.kv_heads, 288)[:, :, :256]
            mask = torch.ones(8, 1, 1, 256, dtype=torch.bool, device=like.device)
            sdpa_s, products_s = (
                _best_time(lambda f=f: f(q, k, v, mask), like.device) for f in (sdpa, products)
            )
            return sdpa_s, products_s

        name = (
            f"decode attention {_where(like.device)} {like.dtype}, "
            f"{self.heads}/{self.kv_heads} heads of {self.head_dim}"
        )
        return products if _choice(name, timings) else sdpa

    def _layer(self, layer: nn.Module, lora_dtype: torch.dtype | None) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp

        def projection(*modules: nn.Module) -> _Projection:
            bases = [getattr(m, "base_layer", m) for m in modules]
            result = _Projection([b.weight for b in bases], [b.bias for b in bases])
            pieces = [(m, name) for m in modules if hasattr(m, "lora_A") for name in _adapters(m)]
            if not pieces:
                return result
            dtype = lora_dtype or pieces[0][0].lora_A[pieces[0][1]].weight.dtype
            outs = [b.weight.shape[0] for b in bases]
            rank = sum(m.lora_A[name].weight.shape[0] for m, name in pieces)
            a = torch.cat([m.lora_A[name].weight.detach() for m, name in pieces]).to(dtype)
            b = bases[0].weight.new_zeros((sum(outs), rank), dtype=torch.float32)
            col = 0
            for m, name in pieces:
                row = sum(outs[: modules.index(m)])
                weight = m.lora_B[name].weight.detach().float() * m.scaling[name]
                b[row : row + weight.shape[0], col : col + weight.shape[1]] = weight
                col += weight.shape[1]
            result.a, result.b = a, b.to(dtype)
            return result

        def norm(module: nn.Module) -> tuple[torch.Tensor, float]:
            return module.weight, module.variance_epsilon

        return _Layer(
            norm(layer.input_layernorm),
            projection(attn.q_proj, attn.k_proj, attn.v_proj),
            projection(attn.o_proj),
            norm(layer.post_attention_layernorm),
            projection(mlp.gate_proj, mlp.up_proj),
            projection(mlp.down_proj),
        )

    @torch.no_grad()
    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Float32 logits (B, V) of the next token after ``tokens`` (B,) at ``positions`` (B,).

        ``cache`` (a transformers cache with one layer per decoder layer) gets the tokens'
        keys and values appended; ``mask`` (B, 1, 1, columns after the append), boolean, True
        where a row attends, or None when every row attends to every column. Runs the
        weights :meth:`prepare` prepared last (prepares them on the first call).
        """
        if self._key is None:
            self.prepare()
        lm, layers = self.lm, self._layers
        if self._attend is None:
            self._attend = self._attention(lm.get_input_embeddings().weight)
        hidden = lm.get_input_embeddings()(tokens)  # (B, hidden): one position per row
        device = hidden.device.type
        with torch.autocast(device, enabled=False):
            cos, sin = lm.model.rotary_emb(hidden, positions[:, None])
            half = sin.shape[-1] // 2
            sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, 1, D): every head
            batch, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
            for index, layer in enumerate(layers):
                q, k, v = layer.qkv(_rms_norm(hidden, *layer.norm1))
                q = _rotate(q.view(batch, heads, 1, dim), cos, sin)
                k = _rotate(k.view(batch, kv_heads, 1, dim), cos, sin)
                keys, values = cache.layers[index].update(k, v.view(batch, kv_heads, 1, dim))
                attended = self._attend(q, keys, values, mask)
                (out,) = layer.o(attended.reshape(batch, heads * dim))
                hidden = hidden + out
                gate, up = layer.gate_up(_rms_norm(hidden, *layer.norm2))
                (out,) = layer.down(self.act(gate) * up)
                hidden = hidden + out
            return lm.get_output_embeddings()(lm.model.norm(hidden)).float()


def one_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of one query a row: ``query`` (B, H, 1, D) over ``key``/``value`` (B, H_kv, S, D).

    The H / H_kv query heads of a key/value head go into one product with it, keys on the
    left (``key @ query.T``): the keys may be a view of a longer cache buffer, which this
    order reads in place (``query @ key.T`` copied them: 0.58 against 0.19 ms at batch 8
    over 512 bf16 keys). Scores and softmax in float32; ``mask`` (B, 1, 1, S) boolean,
    True attends. Returns (B, H, 1, D).

    Example:
        >>> q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
        >>> mask = torch.tensor([True, True, False, True, True]).expand(2, 1, 1, 5)
        >>> expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        >>> torch.allclose(one_query_attention(q, k, v, mask, 8**-0.5), expected, atol=1e-6)
        True
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    stacked = query.view(batch, kv_heads, heads // kv_heads, dim)
    scores = (key @ stacked.transpose(-1, -2)).transpose(-1, -2).float() * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1).to(value.dtype)
    return (probs @ value).view(batch, heads, 1, -1)


def lean_decoder(model: nn.Module) -> LeanDecoder | None:
    """The :class:`LeanDecoder` of ``model``, or None where the loop does not cover it.

    Covered: ``config.model_type`` in :data:`SUPPORTED_MODEL_TYPES` (Llama and its
    checkpoints, e.g. SmolLM2), plain LoRA adapters (no DoRA or other variants), the usual
    decoder layer layout. The decoder is built once per model and kept while the model lives.
    """
    if model in _DECODERS:
        return _DECODERS[model]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = LeanDecoder(base) if _covered(base) else None
    _DECODERS[model] = decoder
    return decoder


def _covered(lm: nn.Module) -> bool:
    config = getattr(lm, "config", None)
    inner = getattr(lm, "model", None)
    if config is None or getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(config, "pretraining_tp", 1) != 1 or not hasattr(inner, "rotary_emb"):
        return False
    for module in lm.modules():
        if hasattr(module, "lora_A") and (
            getattr(module, "lora_variant", None) or any(module.lora_bias.values())
        ):
            return False
    return True


CLEARLY_FASTER = 1.25
"""How much faster the loop's alternative to what transformers runs (a kernel, the adapters'
dtype) must measure before it is chosen: timings of close options flip under load."""


def _choice(name: str, timings: Callable[[], tuple[float, float]]) -> bool:
    """Whether the loop's option is :data:`CLEARLY_FASTER` than the default, asked once a machine.

    ``timings()`` gives the seconds of (the default, the loop's option); it runs only where
    the machine has not chosen yet. The answer is kept for the process and in the precision
    cache file (:func:`~textgym_agents.model.precision.measured_choice`): numerics that differ
    by a kernel change what a seeded run samples, so every run on a machine must choose alike.
    """
    from textgym_agents.model.loading import cache_dir
    from textgym_agents.model.precision import PRECISION_FILE, measured_choice

    def measure() -> str:
        default, other = timings()
        return "other" if default > CLEARLY_FASTER * other else "default"

    return measured_choice(name, measure, cache_file=cache_dir() / PRECISION_FILE) == "other"


def _where(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _noise(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Random inputs for a timing from a private generator: the global draws stay as they were."""
    generator = torch.Generator(device=like.device).manual_seed(0)
    return torch.randn(shape, generator=generator, device=like.device).to(like.dtype)


def _best_time(run: Callable[[], Any], device: torch.device, repeats: int = 10) -> float:
    """The best of ``repeats`` timings of ``run()`` on ``device``, in seconds, autocast off."""
    best = float("inf")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    with torch.autocast(device.type, enabled=False):
        for _ in range(repeats):
            synchronize()
            start = time.perf_counter()
            run()
            synchronize()
            best = min(best, time.perf_counter() - start)
    return best


def _time_pair(a: torch.Tensor, b: torch.Tensor) -> float:
    """Seconds of ``x @ a.T @ b.T`` at batch 1 plus batch 8."""
    total = 0.0
    for batch in (1, 8):
        x = _noise((batch, a.shape[1]), a)
        total += _best_time(lambda x=x: F.linear(F.linear(x, a), b), a.device, repeats=20)
    return total


def _adapters(module: nn.Module) -> list[str]:
    """The adapters a peft LoRA layer adds to its output now (none when disabled or merged)."""
    if module.disable_adapters or module.merged:
        return []
    return [name for name in module.active_adapters if name in module.lora_A]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: the statistics in float32, the product in the input's dtype."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding, ``x * cos + rotate_half(x) * sin``, in fewer operations.

    ``rotate_half(x)`` is ``cat(-x2, x1)``: the halves swapped (a roll), the sign moved into
    ``signed_sin`` (``cat(-sin1, sin2)``, made once a step). The same numbers.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def warp(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """``logits`` (B, V) as ``generate()``'s warpers leave them, in their order.

    Temperature, then top-k (the ``top_k`` highest, ties kept), then top-p (the smallest set
    of tokens whose probabilities sum past ``top_p``, at least one); dropped tokens get -inf.

    Example:
        >>> warp(torch.tensor([[0.0, 5.0, 1.0]]), temperature=2.0, top_k=2).tolist()
        [[-inf, 2.5, 0.5]]
    """
    if temperature != 1.0:
        logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(logits, descending=False)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[..., -1:] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The next token of each row (B,) from float32 ``logits`` (B, V), as ``generate()`` draws.

    Greedy: the argmax. Else one multinomial draw from the :func:`warp` ed logits' softmax.

    Example:
        >>> logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
        >>> sample_next(logits, greedy=True).tolist()
        [1, 0]
        >>> sample_next(logits, greedy=False, top_k=1).tolist()
        [1, 0]
    """
    if greedy:
        return logits.argmax(dim=-1)
    warped = warp(logits, temperature, top_k, top_p)
    return torch.multinomial(warped.softmax(dim=-1), num_samples=1).squeeze(1)


def decode_rows(
    decoder: LeanDecoder,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    *,
    max_new_tokens: int,
    eos_ids: set[int],
    pad: int,
    greedy: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    processor: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    stopped: Callable[[list[int]], bool] | None = None,
) -> torch.Tensor:
    """Sample up to ``max_new_tokens`` per row, from the prompt pass's last ``logits`` (B, V).

    ``cache`` holds every column of ``input_ids`` (B, W); ``attention_mask`` (B, W) says which
    hold a token. A row ends at an EOS or when ``stopped(its new tokens)`` says so, then gets
    ``pad``; the loop ends when every row has, or at the budget. ``processor(ids, scores)``
    (a logits processor, e.g. a grammar mask) sees each step's scores first. The last token
    drawn is never run (its column is not in the cache), as in ``generate()``. Returns the
    sequences (B, W + new tokens), like ``generate()``.
    """
    decoder.prepare()
    batch, width = input_ids.shape
    device = input_ids.device
    sequences = torch.full((batch, width + max_new_tokens), pad, dtype=torch.long, device=device)
    sequences[:, :width] = input_ids
    padded = not bool(attention_mask.all())
    columns = torch.ones((batch, width + max_new_tokens), dtype=torch.bool, device=device)
    columns[:, :width] = attention_mask.bool()
    positions = attention_mask.long().sum(dim=1)  # the next token's position in each row
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    eos = torch.tensor(sorted(eos_ids), device=device)
    new: list[list[int]] = [[] for _ in range(batch)]
    step = 0
    while True:
        if processor is not None:
            logits = processor(sequences[:, : width + step], logits)
        tokens = sample_next(
            logits, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p
        )
        tokens = torch.where(done, torch.full_like(tokens, pad), tokens)
        sequences[:, width + step] = tokens
        done = done | torch.isin(tokens, eos)
        if stopped is not None:
            for b, token in enumerate(tokens.tolist()):
                new[b].append(token)
                if not done[b] and stopped(new[b]):
                    done[b] = True
        step += 1
        if step == max_new_tokens or bool(done.all()):
            return sequences[:, : width + step]
        mask = columns[:, None, None, : width + step] if padded else None
        logits = decoder.step(tokens, positions, cache, mask)
        positions = positions + 1

"""A direct forward for Llama-shaped decoders: the module's own weights and operations, without its module calls.

On a small model a decode step spends about a third of its time in Python: `nn.Module.__call__`, config lookups,
keyword plumbing and output objects around each of the ~50 small operations of a layer. `NativeForward` runs the
same operations in the same order on the same parameter tensors (shared, not copied), so its logits are identical
to the module's: RMSNorm in float32 then back to the weight's dtype, the model's own rotary embedding module,
projections with `F.linear`, keys and values written through the cache layer's `update`, and attention through
fastdecode's attention function with each layer's sliding window from the plan. It covers decoders whose layers
are exactly norm → attention (q/k/v/o projections, optional biases) → residual → norm → gated SiLU MLP → residual,
recognised by structure (`native_forward` returns None for anything else, which keeps the transformers path:
quantised or adapter-wrapped projections, hooks on a layer at load time). Hooks registered after loading are not run
by the direct forward: set `model.native = None` to keep them.

`NativeForward.fuse()` (`load(fused=None)` turns it on with CUDA graphs on CUDA) runs the layer's elementwise runs
through `torch.compile`d functions (the two norms with the residual add before the second, the rotary products, SiLU
times the up projection): the same operations, fused into a few kernels per layer. On a GPU in CUDA graphs a decode
step of a small model is bound by the number of kernels, not by their work (issue #30), which is where this pays; its
rounding differs from the unfused forward's (a fused norm keeps float32 inside), so it is a setting of its own: every
forward of a generation must run with the same setting for exact mode's identity to hold, and the identity is with
`ar.greedy` under the same setting.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from .. import attention
from ..cache import KVCache
from ..errors import FastDecodeWarning, ParameterError
from .capabilities import sliding_windows
from .layers import add_rms_norm, gated, rms_norm

# decoder classes whose layers have exactly the structure below (others, e.g. Qwen3's per-head q/k norms or Gemma's
# extra norms and scaled embeddings, keep the transformers path)
_CLASSES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")


@dataclass(frozen=True)
class _Layer:
    attn: Any  # the attention module, handed to the attention function as transformers does (it reads layer_idx)
    in_norm: torch.Tensor
    in_eps: float
    q: Any  # nn.Linear (its weight and bias are read at call time, so later weight edits are seen)
    k: Any
    v: Any
    o: Any
    post_norm: torch.Tensor
    post_eps: float
    gate: Any
    up: Any
    down: Any
    head_dim: int
    scaling: float
    index: int  # the cache slot (transformers' layer_idx)
    window: int | None


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _swap_halves(x) * sin


# the norms and the gated MLP's elementwise part are the zoo's own (models/layers.py): the same operations as
# transformers' Llama, in the same order
_rms, _add_rms, _gated = rms_norm, add_rms_norm, gated


@dataclass(frozen=True)
class _Ops:
    """The elementwise runs of a layer: the plain functions, or the same compiled (`NativeForward.fuse`)."""

    rms: Any = _rms
    rope: Any = _rope
    add_rms: Any = _add_rms
    gated: Any = _gated


_PLAIN = _Ops()
T = TypeVar("T")
_RECOMPILE_LIMIT = 64  # compiled versions allowed per fused function (torch's default: 8)


class NativeForward:
    """`forward(ids, positions, cache, plan)` for one supported model; see the module docstring."""

    def __init__(self, model: Any) -> None:
        self.inner = model.model
        self.count = int(model.config.num_hidden_layers)
        self.windows = sliding_windows(model)
        self.embed = self.inner.embed_tokens
        self.rotary = self.inner.rotary_emb
        self.norm, self.norm_eps = self.inner.norm.weight, float(self.inner.norm.variance_epsilon)
        self.lm_head = model.lm_head
        self._layers: dict[int, _Layer] = {}  # by id of the decoder layer module
        self.fusion = Fusion(_PLAIN, dynamic=False)

    @property
    def fused(self) -> bool:
        return self.fusion.on

    def fuse(self, on: bool = True, backend: Any = "inductor") -> None:
        """Run the layers' elementwise runs as compiled functions (`on`), or the plain ones. Each function is compiled
        for its shapes on first use (`dynamic=False`: exact mode gives every forward of a generation the same shapes,
        so no forward switches kernels half-way); `backend` is `torch.compile`'s (`"eager"` traces without
        generating kernels, as the CPU tests do). Graphs captured before the switch belong to caches of earlier
        generations; a new cache captures the new setting."""
        self.fusion.fuse(self, on, backend)

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, plan: attention.Plan,
        num_logits: int | None, picked: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(logits `[B, T', V]` in the model's dtype, last hidden states after the final norm `[B, T, H]`, the
        outputs `[B, T, H]` of the decoder layers `picked` (indices into the layer list as it runs), in that order).

        The first fused forward is where torch.compile builds its kernels; where it cannot (no Triton, no C compiler
        on a GPU machine), the forward runs again unfused, which stays the setting, with a warning. Rerunning is safe:
        it writes the same cache columns, and no fused output was used yet. A later forward whose new shape cannot be
        compiled does the same (the rest of that generation then rounds as the unfused forward does)."""
        return self.fusion.run(lambda: self._forward(ids, positions, cache, plan, num_logits, picked))

    def _layer(self, layer: Any) -> _Layer:
        """What the forward reads of one decoder layer, collected once. The layer list is read at every forward, so a
        shortened list (spec.layerskip's drafts) is seen; each layer writes its own cache slot (`layer_idx`)."""
        found = self._layers.get(id(layer))
        if found is None:
            a, m = layer.self_attn, layer.mlp
            found = self._layers[id(layer)] = _Layer(
                a, layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon),
                a.q_proj, a.k_proj, a.v_proj, a.o_proj,
                layer.post_attention_layernorm.weight, float(layer.post_attention_layernorm.variance_epsilon),
                m.gate_proj, m.up_proj, m.down_proj, int(a.head_dim), float(a.scaling), int(a.layer_idx),
                self.windows.get(int(a.layer_idx)),
            )
        return found

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, plan: attention.Plan,
        num_logits: int | None, picked: tuple[int, ...] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        B, T = ids.shape
        h = F.embedding(ids, self.embed.weight, self.embed.padding_idx)
        cos, sin = self.rotary(h, positions)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
        # transformers' rotate_half(x) * sin is cat(-x2, x1) * sin; negating the sine's first half once instead of
        # each x's second half gives the same products exactly (a sign flip is exact)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        ops = self.fusion.ops
        with attention.planned(plan):
            kept: dict[int, torch.Tensor] = {}
            for i, layer in enumerate(self.inner.layers[: self.count]):
                L = self._layer(layer)
                x = ops.rms(h, L.in_norm, L.in_eps)
                q = F.linear(x, L.q.weight, L.q.bias).view(B, T, -1, L.head_dim).transpose(1, 2)
                k = F.linear(x, L.k.weight, L.k.bias).view(B, T, -1, L.head_dim).transpose(1, 2)
                v = F.linear(x, L.v.weight, L.v.bias).view(B, T, -1, L.head_dim).transpose(1, 2)
                q = ops.rope(q, cos, sin)
                k = ops.rope(k, cos, sin)
                if cache is not None:
                    k, v = cache.layers[L.index].update(k, v)  # type: ignore[union-attr]  # our own layers
                out, _ = attention.attention(L.attn, q, k, v, None, scaling=L.scaling, sliding_window=L.window)
                h, x = ops.add_rms(h, F.linear(out.reshape(B, T, -1).contiguous(), L.o.weight, L.o.bias), L.post_norm,
                                   L.post_eps)
                gated = ops.gated(F.linear(x, L.gate.weight, L.gate.bias), F.linear(x, L.up.weight, L.up.bias))
                h = h + F.linear(gated, L.down.weight, L.down.bias)
                if picked is not None and i in picked:
                    kept[i] = h  # a new tensor each layer (never written in place), so no copy is needed
        h = ops.rms(h, self.norm, self.norm_eps)
        last = h if num_logits is None else h[:, -num_logits:]
        layers = tuple(kept[i] for i in picked) if picked else ()
        return F.linear(last, self.lm_head.weight, self.lm_head.bias), h, layers


def compiled(fn: Any, owner: object, backend: Any, dynamic: bool | None) -> Any:
    """`fn` through `torch.compile` (whole: `fullgraph=True`), as a copy with its own code object: torch.compile keeps
    its compiled versions on the code object, so one model's shapes never count against another model's (or another
    backend's) versions. Each shape compiles once; torch's default of 8 compiled versions per function would leave
    a server of many batch sizes without kernels, so the limit is raised to 64."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _RECOMPILE_LIMIT)
    own = types.FunctionType(fn.__code__.replace(co_name=f"{fn.__name__}_{id(owner):x}"), fn.__globals__,
                             fn.__name__, fn.__defaults__, fn.__closure__)
    return torch.compile(own, dynamic=dynamic, fullgraph=True, backend=backend)


class Fusion:
    """A model's elementwise runs, as the plain functions of `plain` (a frozen dataclass of functions) or the same
    compiled (`fuse`), and the fall-back that `run` gives a forward: where the compiled functions raise (torch.compile
    could not build the kernels), the model returns to the plain ones for good and the forward runs again, with one
    warning. Both owners (`NativeForward`, the zoo's `MDLMForMaskedDiffusion`) hold one."""

    def __init__(self, plain: Any, dynamic: bool | None) -> None:
        self.plain, self.dynamic = plain, dynamic
        self.ops = plain
        self.proven = False  # a fused forward has run: torch.compile works here (a later failure is a new shape's)

    @property
    def on(self) -> bool:
        return self.ops is not self.plain

    def fuse(self, owner: object, on: bool, backend: Any) -> None:
        """Compile every function of `plain` for `owner` (`compiled`), or go back to the plain ones."""
        self.proven = False
        self.ops = (dataclasses.replace(self.plain, **{f.name: compiled(getattr(self.plain, f.name), owner, backend,
                                                                          self.dynamic)
                                                       for f in dataclasses.fields(self.plain)})
                    if on else self.plain)

    def run(self, forward: Callable[[], T]) -> T:
        """`forward()` under `ops`; the unfused rerun re-raises real errors."""
        if not self.on:
            return forward()
        try:
            out = forward()
        except Exception as e:  # noqa: BLE001  (whatever the compiler raised)
            self.ops = self.plain
            out = forward()
            warn_unfused(e, self.proven)
            return out
        self.proven = True
        return out


def warn_unfused(error: BaseException, proven: bool) -> None:
    """The warning of a fused forward that could not be compiled (and ran again unfused): what the compiler raised,
    under torch.compile's wrappers, and from when on the model runs unfused."""
    cause = error
    while True:  # torch.compile wraps what failed (BackendCompilerFailed's inner exception, or a cause)
        inner = getattr(cause, "inner_exception", None) or cause.__cause__
        if not isinstance(inner, BaseException):
            break
        cause = inner
    first = (str(cause).splitlines() or [""])[0][:200]
    where = ("from this forward on (a new shape could not be compiled)" if proven else
             "(load(fused=False) / --no-fused skips the attempt)")
    warnings.warn(f"the fused kernels could not be built here ({type(cause).__name__}: {first}); this model "
                  f"runs unfused {where}", FastDecodeWarning, stacklevel=4)


def fused_default(device: torch.device, graphs: object) -> bool:
    """`load(fused=None)`: the fused kernels where they pay and can be built: with CUDA graphs on a CUDA device (a
    step there is bound by its number of kernels; 1.26x on an H200, docs/gpu.md) and Triton importable."""
    return device.type == "cuda" and graphs == "cuda" and importlib.util.find_spec("triton") is not None


def check_fused(value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ParameterError(f"fused={value!r}: pass True, False or None (on with CUDA graphs on a CUDA device).")


def native_forward(model: Any) -> NativeForward | None:
    """A `NativeForward` for `model` if its structure is one the direct forward reproduces exactly, else None."""
    if type(model).__name__ not in _CLASSES or getattr(model.config, "pretraining_tp", 1) not in (None, 1):
        return None
    inner: Any = getattr(model, "model", None)
    try:
        if type(inner.norm).__name__ not in _NORMS or getattr(model.config, "hidden_act", "") != "silu":
            return None
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            parts = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
            if not all(type(p) is torch.nn.Linear for p in parts):
                return None  # quantised (bitsandbytes subclasses nn.Linear), adapter-wrapped or replaced projections
            if any(mod._forward_hooks or mod._forward_pre_hooks for mod in layer.modules()):
                return None  # someone watches or edits a submodule's forward: keep the forward that runs hooks
            if type(layer.input_layernorm).__name__ not in _NORMS:
                return None
            if m.act_fn.__class__.__name__ not in ("SiLUActivation", "SiLU"):
                return None
    except AttributeError:
        return None
    return NativeForward(model)

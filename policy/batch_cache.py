"""A decoding batch's KV cache: layers that write into preallocated buffers, rows that join a
running batch (:meth:`PreallocLayer.join`), and grouped attention, where each group of rows reads
the cache from its own first column. :class:`evolve.policy.sampling.Decoder` runs on it."""

from __future__ import annotations

import threading
from typing import Any

_PREALLOC: Any = None  # the PreallocLayer class, made on first use (transformers imported then)


def prealloc_layer_class() -> Any:
    """A DynamicLayer that writes into a preallocated buffer instead of ``torch.cat`` per step
    (which copies the whole cache every token and dominated decoding time)."""
    global _PREALLOC
    if _PREALLOC is None:
        from transformers.cache_utils import DynamicLayer

        class PreallocLayer(DynamicLayer):
            def __init__(self, capacity: int) -> None:
                super().__init__()
                self.capacity, self.n = capacity, 0
                self.kbuf: Any = None
                self.vbuf: Any = None

            def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                k, v, n, m = key_states, value_states, self.n, key_states.shape[-2]
                if self.kbuf is None or n + m > self.kbuf.shape[-2]:
                    cap = max(self.capacity, 2 * (n + m))
                    kb = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
                    vb = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
                    if n:
                        kb[:, :, :n] = self.kbuf[:, :, :n]
                        vb[:, :, :n] = self.vbuf[:, :, :n]
                    self.kbuf, self.vbuf = kb, vb
                self.kbuf[:, :, n : n + m] = k
                self.vbuf[:, :, n : n + m] = v
                self.n = n + m
                self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]
                return self.keys, self.values

            def drop_front(self, c: int) -> None:
                """Forget the first ``c`` columns (a view of the same buffer)."""
                self.kbuf, self.vbuf, self.n = self.kbuf[:, :, c:], self.vbuf[:, :, c:], self.n - c
                self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]

            def join(self, keep: Any, other: Any, width: int, capacity: int) -> None:
                """Become this layer's rows ``keep`` and then ``other``'s rows, both right-aligned at
                column ``width``, in new buffers of ``capacity`` columns."""
                n, m = self.n, other.n
                ka, va = self.kbuf[keep, :, :n], self.vbuf[keep, :, :n]
                kb, vb = other.kbuf[:, :, :m], other.vbuf[:, :, :m]
                k0 = ka.shape[0]
                shape = (k0 + kb.shape[0], ka.shape[1], max(capacity, width), ka.shape[3])
                kbuf, vbuf = ka.new_empty(shape), va.new_empty(shape)
                for buf, old, new in ((kbuf, ka, kb), (vbuf, va, vb)):
                    buf[:k0, :, : width - n].zero_()  # padding: masked, but never garbage (0 x NaN is NaN)
                    buf[:k0, :, width - n : width] = old
                    buf[k0:, :, : width - m].zero_()
                    buf[k0:, :, width - m : width] = new
                self.kbuf, self.vbuf, self.n = kbuf, vbuf, width
                self.keys, self.values = kbuf[:, :, :width], vbuf[:, :, :width]

            def batch_select_indices(self, indices: Any) -> None:
                if self.kbuf is not None:
                    self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
                    self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]

        _PREALLOC = PreallocLayer
    return _PREALLOC


def new_cache(model: Any, capacity: int = 0) -> Any:
    """A cache for ``model`` whose layers write into buffers of ``capacity`` columns (a plain
    DynamicCache where transformers lays its cache out otherwise)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
    if (
        capacity > 0
        and isinstance(getattr(cache, "layers", None), list)
        and len(cache.layers) == model.config.num_hidden_layers
    ):
        try:
            cache.layers = [prealloc_layer_class()(capacity) for _ in cache.layers]
        except Exception:  # noqa: BLE001 - an unexpected transformers layout: keep the plain cache
            pass
    return cache


def joinable(cache: Any) -> bool:
    """Whether rows can join ``cache`` (its layers are preallocated ones)."""
    return all(hasattr(layer, "kbuf") for layer in getattr(cache, "layers", [None]))


GROUPS = threading.local()  # the running Decoder's row groups, for the attention of its decoding steps
GROUPED = "evolve_grouped_sdpa"
_REGISTERED = False


def grouped_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """PyTorch's SDPA attention as transformers calls it, except in a decoding step of a
    :class:`~evolve.policy.sampling.Decoder` whose rows joined at different times: each group of
    rows (consecutive in the batch) reads the cache from its own first column, not from the
    batch's, so a row that joined late does not read the older rows' columns (a decoding step's
    time is mostly that read)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(GROUPS, "groups", None)
    if not groups or query.shape[2] != 1 or key.shape[0] != query.shape[0]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outs = []
    for a, b, c in groups:
        mask = attention_mask[a:b, ..., c:] if attention_mask is not None else None
        out, _ = sdpa_attention_forward(module, query[a:b], key[a:b, :, c:], value[a:b, :, c:], mask, **kwargs)
        outs.append(out)
    return torch.cat(outs, 0), None


def grouping(model: Any) -> bool:
    """Whether decoding steps can read the cache group by group (the model attends with SDPA);
    registers :func:`grouped_sdpa` with transformers the first time."""
    global _REGISTERED
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", GROUPED):
        return False
    if not _REGISTERED:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(GROUPED, grouped_sdpa)
        AttentionMaskInterface.register(GROUPED, sdpa_mask)
        _REGISTERED = True
    return True

"""Packed and scaled weight formats besides block FP8: the math, as pure torch.

A :class:`Scheme` says how one stored weight becomes a floating tensor; its tensors come
in a fixed order (:attr:`Scheme.roles`):

- ``mxfp4`` (gpt-oss): ``blocks`` U8 ``[..., rows, G, 16]`` (32 E2M1 codes per 16 bytes,
  value ``2j`` in the low nibble of byte ``j``) and ``scales`` U8 ``[..., rows, G]``
  (E8M0: ``2**(byte − 127)``). Rows are the output dim; ``transpose`` gives
  ``[..., in, out]`` (gpt-oss's fused experts).
- ``fp8`` (compressed-tensors ``float-quantized``): ``weight`` F8 and ``weight_scale``,
  a multiplier per tensor ``(1,)``, channel ``(out, 1)``, group ``(out, ⌈in/g⌉)`` or block
  ``(⌈out/b0⌉, ⌈in/b1⌉)``.
- ``int`` (compressed-tensors ``pack-quantized``): ``weight_packed`` I32 ``(out, ⌈in·b/32⌉)``
  (element ``i`` at bits ``[b·i, b·i + b)`` of the little-endian bit stream, stored
  ``+2**(b−1)``), ``weight_scale`` ``(out, ⌈in/g⌉)`` and, asymmetric, ``weight_zero_point``
  packed the same way along ``out``. ``W = (q − z) · s``. Act-order (GPTQ's
  ``weight_g_idx``, int ``(in,)``): column ``i`` takes group ``g_idx[i]``'s scale and
  zero point instead of group ``i // g``.
- ``nvfp4``: ``weight_packed`` U8 ``(out, in/2)`` (E2M1, low nibble first),
  ``weight_scale`` F8_E4M3 ``(out, ⌈in/16⌉)`` and a global scale: compressed-tensors
  divides by ``weight_global_scale``, ModelOpt multiplies by ``weight_scale_2``
  (``global_divides``).

Every format dequantizes in row chunks of the output dim through one fp32 workspace: the
product is formed in fp32 (exact for these operands), rounded to the scale's dtype where
compressed-tensors computes in it, then to the destination's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from weightplan.planner.core.quant.blocks import CHUNK_BYTES, block_of, expand_rows, scale_columns_
from weightplan.units import counted, format_bytes

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
FORMATS = ("mxfp4", "fp8", "int", "nvfp4")
STRATEGIES = ("tensor", "channel", "group", "block")
WORK_PER_ELEMENT = 16  # fp32 values, int32 codes and unpacking temporaries, per element


class Workspace:
    """Scratch tensors by role, grown as needed and reused chunk after chunk (per reader
    thread, read after read): fresh per-chunk temporaries are what glibc's per-thread
    arenas keep after they are freed (its mmap threshold rises to the first freed)."""

    def __init__(self) -> None:
        self._held: dict[str, torch.Tensor] = {}

    def get(self, role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        held = self._held.get(role)
        if held is None or held.dtype != dtype or held.numel() < n:
            held = self._held[role] = torch.empty(n, dtype=dtype)
        return held[:n].view(shape)


@dataclass(frozen=True, slots=True)
class Scheme:
    """How one stored weight dequantizes (hashable: one object per layout in a plan)."""

    format: str  # one of FORMATS
    strategy: str = "group"  # one of STRATEGIES (mxfp4 / nvfp4: group)
    group: int | None = None  # elements of ``in`` per scale (group strategy)
    block: tuple[int, int] | None = None  # (rows, cols) per scale (block strategy)
    bits: int = 4
    symmetric: bool = True
    transpose: bool = False  # the logical tensor is ``[..., in, out]`` (gpt-oss experts)
    global_divides: bool = True  # nvfp4: compressed-tensors' ``/ global`` (else ``· scale_2``)
    source: str = "compressed-tensors"
    act_order: bool = False  # int: a ``g_idx`` part maps each column to its group

    @property
    def roles(self) -> tuple[str, ...]:
        """The stored tensors, in the order a dequantize node takes them."""
        if self.format == "mxfp4":
            return ("blocks", "scales")
        if self.format == "nvfp4":
            return ("packed", "scale", "global")
        if self.format == "int":
            return ("packed", "scale") + (() if self.symmetric else ("zero",)) \
                + (("g_idx",) if self.act_order else ())
        return ("weight" if self.format == "fp8" else "packed", "scale")

    def describe(self) -> str:
        """One phrase for the printed plan: format, group, scale kind."""
        if self.format == "mxfp4":
            return "MXFP4 (E2M1, 32 per E8M0 scale)"
        if self.format == "nvfp4":
            glob = "÷ weight_global_scale" if self.global_divides else "· weight_scale_2"
            return f"NVFP4 {self.source} (E2M1, 16 per F8 scale, {glob})"
        what = {"tensor": "per tensor", "channel": "per channel",
                "group": f"group {self.group}",
                "block": f"block {self.block[0]}×{self.block[1]}" if self.block else "block"}
        if self.format == "fp8":
            return f"FP8 compressed-tensors ({what[self.strategy]} scales)"
        sym = "symmetric" if self.symmetric else "asymmetric, zero points"
        order = ", act-order g_idx" if self.act_order else ""
        return f"INT{self.bits} pack-quantized ({what[self.strategy]}, {sym}{order})"


def logical_shape(scheme: Scheme, packed: tuple[int, ...], stored: Sequence[int] | None = None
                  ) -> tuple[int, ...]:
    """The dequantized shape of a stored weight of shape ``packed`` (``stored``: the
    ``weight_shape`` values, for ``int``)."""
    if scheme.format == "mxfp4":
        shape = packed[:-2] + (packed[-2] * packed[-1] * 2,)
        return shape[:-2] + (shape[-1], shape[-2]) if scheme.transpose else shape
    if scheme.format == "nvfp4":
        return packed[:-1] + (packed[-1] * 2,)
    if scheme.format == "int":
        assert stored is not None
        return tuple(int(v) for v in stored)
    return tuple(packed)


def natural(scheme: Scheme, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``[..., out, in]`` of a logical shape (undoes ``transpose``)."""
    return shape[:-2] + (shape[-1], shape[-2]) if scheme.transpose else shape


def companion_shapes(scheme: Scheme, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """The stored shape of each role for a logical ``shape`` (what the headers must say)."""
    lead, (out, n) = natural(scheme, shape)[:-2], natural(scheme, shape)[-2:]
    if scheme.format == "mxfp4":
        return {"blocks": lead + (out, n // 32, 16), "scales": lead + (out, n // 32)}
    if scheme.format == "nvfp4":
        return {"packed": lead + (out, n // 2), "scale": lead + (out, -(-n // 16)),
                "global": (1,)}
    if scheme.format == "int":
        words = -(-n * scheme.bits // 32)
        shapes = {"packed": lead + (out, words), "scale": lead + scale_grid(scheme, out, n)}
        if not scheme.symmetric:
            shapes["zero"] = lead + (-(-out * scheme.bits // 32), scale_grid(scheme, out, n)[1])
        if scheme.act_order:
            shapes["g_idx"] = lead + (n,)
        return shapes
    return {"weight": tuple(shape), "scale": scale_grid(scheme, out, n, lead)}


def scale_grid(scheme: Scheme, out: int, n: int, lead: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The scale shape of an ``[out, n]`` matrix under ``scheme``'s strategy."""
    if scheme.strategy == "tensor":
        return (1,)
    if scheme.strategy == "channel":
        return lead + (out, 1)
    if scheme.strategy == "block":
        b0, b1 = scheme.block or (128, 128)
        return lead + (-(-out // b0), -(-n // b1))
    return lead + (out, -(-n // (scheme.group or n or 1)))


def stored_bytes(specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> int:
    return sum(math.prod(s) * d.itemsize for s, d in specs)


def summary(scheme: Scheme, count: int, before: int, after: int, dtype: torch.dtype) -> str:
    """``format: N tensors, X packed → Y <dtype>`` for the printed plan."""
    name = str(dtype).removeprefix("torch.")
    return (f"{scheme.describe()}: {counted(count, 'tensor')}, {format_bytes(before)} stored → "
            f"{format_bytes(after)} {name}")


def rows_per_chunk(n: int, rows: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Output rows decoded at once (a multiple of the block rows is not needed: scales
    are looked up per row)."""
    return max(1, min(rows, chunk_bytes // max(1, WORK_PER_ELEMENT * n)))


def workspace_bytes(scheme: Scheme, shape: tuple[int, ...], chunk_bytes: int = CHUNK_BYTES) -> int:
    """Bytes a dequantize of a logical ``shape`` holds besides its inputs and output."""
    nat = natural(scheme, shape)
    if len(nat) < 2 or 0 in nat:
        return 0
    n = nat[-1]
    return WORK_PER_ELEMENT * rows_per_chunk(n, nat[-2], chunk_bytes) * n


def dequantize(scheme: Scheme, parts: Sequence[torch.Tensor], shape: tuple[int, ...],
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A fresh ``dtype`` tensor of logical ``shape`` from the stored ``parts``."""
    out = torch.empty(shape, dtype=dtype)
    for idx, o0, o1, x in chunks(scheme, parts, shape):
        write_chunk(scheme, out[idx], o0, o1, x)
    return out


def write_chunk(scheme: Scheme, matrix: torch.Tensor, o0: int, o1: int, x: torch.Tensor) -> None:
    """Write decoded output rows ``[o0, o1)`` (``x``: ``[o1 − o0, in]``) into a logical matrix."""
    if scheme.transpose:
        matrix[:, o0:o1].copy_(x.T)
    else:
        matrix[o0:o1].copy_(x)


def chunks(scheme: Scheme, parts: Sequence[torch.Tensor], shape: tuple[int, ...],
           out_rows: tuple[int, int] | None = None, chunk_bytes: int = CHUNK_BYTES,
           leads: Iterable[tuple[int, ...]] | None = None, workspace: Workspace | None = None
           ) -> Iterator[tuple[tuple[int, ...], int, int, torch.Tensor]]:
    """Yield ``(index, o0, o1, x)``: ``x`` (fp32 ``[o1 − o0, in]``, valid until the next
    step) is output rows ``[o0, o1)`` of matrix ``index`` of the weight of logical
    ``shape``, in the scale's precision (``out_rows``, ``leads``: only those)."""
    nat = natural(scheme, shape)
    out, n = nat[-2], nat[-1]
    lo, hi = out_rows or (0, out)
    step = rows_per_chunk(n, hi - lo, chunk_bytes)
    decode = _DECODERS[scheme.format]
    extras = _prepared(scheme, parts, nat)
    extras["ws"] = workspace if workspace is not None else Workspace()
    for idx in (_leading(nat) if leads is None else leads):
        for o0 in range(lo, hi, step):
            o1 = min(hi, o0 + step)
            yield idx, o0, o1, decode(scheme, parts, extras, idx, o0, o1, n)


def region_chunks(scheme: Scheme, parts: Sequence[torch.Tensor], shape: tuple[int, ...],
                  starts: tuple[int, ...], stops: tuple[int, ...],
                  chunk_bytes: int = CHUNK_BYTES, workspace: Workspace | None = None
                  ) -> Iterator[tuple[tuple[int, ...], tuple[int, int], tuple[int, int], torch.Tensor]]:
    """The box ``[starts, stops)`` of the logical tensor, chunk by chunk: ``(index, rows,
    cols, x)`` with ``index``, ``rows``, ``cols`` relative to the box and ``x`` fp32 of
    ``(rows, cols)``'s extent (a rank's slice decodes only its own rows)."""
    (r0, c0), (r1, c1) = starts[-2:], stops[-2:]
    leads = list(itertools.product(*(range(a, b) for a, b in zip(starts[:-2], stops[:-2], strict=True))))
    out_rows, in_cols = ((c0, c1), (r0, r1)) if scheme.transpose else ((r0, r1), (c0, c1))
    for idx, o0, o1, x in chunks(scheme, parts, shape, out_rows, chunk_bytes, leads,
                                 workspace):
        local = tuple(i - a for i, a in zip(idx, starts, strict=False))
        part = x[:, in_cols[0]:in_cols[1]]
        if scheme.transpose:
            yield local, (0, r1 - r0), (o0 - c0, o1 - c0), part.T
        else:
            yield local, (o0 - r0, o1 - r0), (0, c1 - c0), part


def _leading(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(d) for d in shape[:-2]))


def _prepared(scheme: Scheme, parts: Sequence[torch.Tensor], nat: tuple[int, ...]) -> dict:
    """Per-call constants: decoded scales and zero points (small next to the weight)."""
    extras: dict = {}
    if scheme.format in ("mxfp4", "nvfp4"):
        extras["lut"] = torch.tensor(E2M1, dtype=torch.float32)
    if scheme.format == "int" and not scheme.symmetric:
        zero = parts[2]
        lead, out = nat[:-2], nat[-2]
        groups = parts[1].shape[-1]
        flat = zero.reshape(-1, *zero.shape[-2:])
        unpacked = [unpack_ints(m.T.contiguous(), scheme.bits, out).T for m in flat]
        extras["zero"] = torch.stack(unpacked).reshape(*lead, out, groups).to(torch.float32)
    if scheme.format == "int" and scheme.act_order:
        extras["g_idx"] = _groups_of(parts[-1], parts[1].shape[-1])
    return extras


def _groups_of(g_idx: torch.Tensor, groups: int) -> torch.Tensor:
    """``g_idx`` as indices, each checked to name a group of the scale grid."""
    from weightplan.errors import QuantizationError

    g = g_idx.to(torch.int64)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= groups):
        raise QuantizationError(f"weight_g_idx names group {int(g.max())} (or "
                                f"{int(g.min())}) but the scales have {groups} groups")
    return g


def unpack_ints(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Signed ints from int32 words ``[rows, w]``: ``count`` per row, ``bits`` each
    (LSB-first bit stream over little-endian words, stored ``+2**(bits−1)``) → int32."""
    # (flattened first: a [k, 1] transpose is "contiguous" with a last stride of k)
    raw = words.contiguous().flatten().view(torch.uint8).to(torch.int32)
    raw = raw.reshape(*words.shape[:-1], words.shape[-1] * 4)
    if bits == 8:
        values = raw
    else:  # 4
        values = torch.stack((raw & 0xF, raw >> 4), dim=-1).flatten(-2)
    return values[..., :count] - (1 << (bits - 1))


def _decode_int(scheme: Scheme, parts: Sequence[torch.Tensor], extras: dict,
                idx: tuple[int, ...], o0: int, o1: int, n: int) -> torch.Tensor:
    ws: Workspace = extras["ws"]
    words = parts[0][idx][o0:o1].contiguous()  # (a view: rows of a row-major part)
    raw = words.flatten().view(torch.uint8).reshape(o1 - o0, words.shape[-1] * 4)
    q = ws.get("x", (o1 - o0, n), torch.float32)
    if scheme.bits == 8:
        q.copy_(raw[:, :n])
    else:  # 4
        q.copy_(_codes(raw, ws)[:, :n])
    q.sub_(1 << (scheme.bits - 1))
    if scheme.act_order:
        return _act_order(scheme, q, parts, extras, idx, o0, o1)
    if "zero" in extras:
        zero = extras["zero"][idx][o0:o1]
        q = _per_group(q, zero, scheme.group or n, torch.sub)
    return _scaled(scheme, q, parts[1], idx, o0, o1, ws)


def _act_order(scheme: Scheme, q: torch.Tensor, parts: Sequence[torch.Tensor], extras: dict,
               idx: tuple[int, ...], o0: int, o1: int) -> torch.Tensor:
    """``(q − z[:, g]) · s[:, g]`` with ``g = g_idx``: each column's own group."""
    g = extras["g_idx"][idx]
    if "zero" in extras:
        q.sub_(extras["zero"][idx][o0:o1][:, g])
    scale = parts[1][idx][o0:o1]
    q.mul_(scale[:, g].to(torch.float32))
    return _round_to(q, scale.dtype, extras["ws"])


def _decode_fp8(scheme: Scheme, parts: Sequence[torch.Tensor], extras: dict,
                idx: tuple[int, ...], o0: int, o1: int, n: int) -> torch.Tensor:
    ws: Workspace = extras["ws"]
    x = ws.get("x", (o1 - o0, n), torch.float32)
    x.copy_(parts[0][idx][o0:o1])
    return _scaled(scheme, x, parts[1], idx, o0, o1, ws)


def _scaled(scheme: Scheme, x: torch.Tensor, scale: torch.Tensor, idx: tuple[int, ...],
            o0: int, o1: int, ws: Workspace) -> torch.Tensor:
    """``x · s`` by the strategy, in fp32, rounded to the scale's dtype as
    compressed-tensors computes it."""
    if scheme.strategy == "tensor":
        x.mul_(scale.reshape(-1)[0].to(torch.float32))
    elif scheme.strategy == "channel":
        x.mul_(scale[idx][o0:o1].to(torch.float32))
    elif scheme.strategy == "block":
        b0, b1 = block_of(x.shape, scheme.block)
        s = scale[idx].to(torch.float32)
        scale_columns_(x, expand_rows(s, b0, o1 - o0, o0), b1)
    else:
        x = _per_group(x, scale[idx][o0:o1].to(torch.float32), scheme.group or x.shape[-1],
                       torch.mul)
    return _round_to(x, scale.dtype, ws)


def _round_to(x: torch.Tensor, dtype: torch.dtype, ws: Workspace) -> torch.Tensor:
    """``x`` rounded to a 16-bit scale's dtype and back in place (compressed-tensors
    computes in the scale's dtype); other dtypes leave it as it is."""
    if dtype in (torch.bfloat16, torch.float16):
        r = ws.get("round", tuple(x.shape), dtype)
        r.copy_(x)
        x.copy_(r)
    return x


def _per_group(x: torch.Tensor, per: torch.Tensor, group: int,
               how: Callable[..., torch.Tensor]) -> torch.Tensor:
    """``how(x, per[:, c // group])`` in place: full groups as a broadcast view, the
    partial last group on its own."""
    full, rem = divmod(x.shape[-1], group)
    if full:
        how(x[:, : full * group].unflatten(-1, (full, group)), per[:, :full, None],
            out=x[:, : full * group].unflatten(-1, (full, group)))
    if rem:
        how(x[:, full * group:], per[:, full:full + 1], out=x[:, full * group:])
    return x


def _codes(packed: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """E2M1 / int4 codes of bytes, low nibble first: ``[..., k]`` → int32 ``[..., 2k]``
    (the workspace's ``codes``)."""
    out = ws.get("codes", (*packed.shape, 2), torch.int32)
    torch.bitwise_and(packed, 0xF, out=out[..., 0])
    torch.bitwise_right_shift(packed, 4, out=out[..., 1])
    return out.flatten(-2)


def _values(lut: torch.Tensor, packed: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """``lut[codes]`` of ``packed`` bytes as fp32 ``[..., 2k]`` (the workspace's ``x``)."""
    codes = _codes(packed, ws)
    x = ws.get("x", tuple(codes.shape), torch.float32)
    torch.index_select(lut, 0, codes.reshape(-1), out=x.view(-1))
    return x


def _decode_mxfp4(scheme: Scheme, parts: Sequence[torch.Tensor], extras: dict,
                  idx: tuple[int, ...], o0: int, o1: int, n: int) -> torch.Tensor:
    blocks, scales = parts[0][idx][o0:o1], parts[1][idx][o0:o1]
    values = _values(extras["lut"], blocks, extras["ws"])  # [rows, G, 32]
    exp = (scales.to(torch.float32) - 127.0).exp2()
    return values.mul_(exp[..., None]).reshape(o1 - o0, n)


def _decode_nvfp4(scheme: Scheme, parts: Sequence[torch.Tensor], extras: dict,
                  idx: tuple[int, ...], o0: int, o1: int, n: int) -> torch.Tensor:
    values = _values(extras["lut"], parts[0][idx][o0:o1], extras["ws"])
    glob = parts[2].reshape(-1)[0].to(torch.float32)
    s = parts[1][idx][o0:o1].to(torch.float32)
    s = s / glob if scheme.global_divides else s * glob
    return _per_group(values, s, 16, torch.mul)


_DECODERS = {"mxfp4": _decode_mxfp4, "fp8": _decode_fp8, "int": _decode_int,
             "nvfp4": _decode_nvfp4}

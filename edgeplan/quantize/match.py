"""Find each ONNX candidate tensor in the int8 TFLite model (DESIGN.md ``tflite_tensor``).

The converter renames tensors, moves NCHW to NHWC and fuses ops (a convolution, its batch norm and its
activation become one CONV_2D), so names cannot be trusted. A candidate matches a TFLite tensor when
  1. the shapes agree (NCHW (n,c,h,w) -> NHWC (n,h,w,c)),
  2. the MACs of everything before it agree (fusion moves no MACs across a cut), and
  3. on the same inputs its dequantized int8 values follow the float ONNX values (cosine similarity),
taking the most similar one; the match must itself be a single-tensor cut of the int8 model. Rule 2
separates tensors that only differ by a residual block. Tensors that pass rules 1-2 together are the
element-wise steps of one fused op (a convolution's raw output, its batch norm, its activation): they
compete for the one int8 tensor and the most similar wins. The floor on the cosine is low on purpose:
int8 error grows with depth (a deep residual stream of a random-weight ResNet50 follows its float
values at a cosine of only 0.6-0.9) while the competition alone decides between fused candidates.
What does not match is dropped with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgeplan.graph.cuts import Candidate
from edgeplan.graph.evaluate import tensor_values_each
from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph


@dataclass(frozen=True)
class Match:
    candidate: Candidate
    tflite_index: int | None
    cosine: float
    reason: str | None = None  # why it was dropped


def _nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape)


def tflite_values(model: bytes, xs: np.ndarray, indices: list[int]) -> dict[int, np.ndarray]:
    """Dequantized values of the int8 model's tensors ``indices``, for every sample (NCHW float inputs)."""
    per: dict[int, list[np.ndarray]] = {}
    for vals in tflite_values_each(model, xs, indices):
        for ix, v in vals.items():
            per.setdefault(ix, []).append(v)
    return {ix: np.concatenate(vs) for ix, vs in per.items() if len(vs) == len(xs)}


def tflite_values_each(model: bytes, xs: np.ndarray, indices: list[int]):
    """Per sample (NCHW float inputs), the dequantized values of the int8 model's tensors ``indices`` it keeps."""
    for kept in _int8_each(model, xs, indices):
        yield dict(kept)


def _int8_each(model: bytes, xs: np.ndarray, indices: list[int]):
    """Per sample, an iterator of ``(index, dequantized values)`` over the tensors of ``indices`` LiteRT kept,
    each dequantized only when the iterator reaches it (to be used up before the next sample)."""
    it = litert.interpreter(model, deterministic=True, keep_all=True, threads=litert.EVERY_CORE)
    inp = it.get_input_details()[0]
    wanted = set(indices)
    details = {d["index"]: d for d in it.get_tensor_details() if d["index"] in wanted}
    for x in xs:
        it.set_tensor(inp["index"], litert.quantize(litert.nchw_to_nhwc(x[None]), inp))
        it.invoke()
        yield _kept(it, details)


def _kept(it, details: dict[int, dict]):
    for ix, d in details.items():
        try:
            v = it.get_tensor(ix)
        except ValueError:
            continue
        if v is not None and v.size:
            yield ix, litert.dequantize(v, d)


def match_candidates(
    onnx_model: onnx.ModelProto | Path,
    candidates: list[Candidate],
    tflite: TfliteGraph,
    xs: np.ndarray,
    *,
    min_cosine: float = 0.5,
    macs_rtol: float = 1e-3,
) -> list[Match]:
    """Each candidate's int8 tensor, or why it has none. ``onnx_model``: the float model, or the path of the .onnx
    edgeplan wrote it to (its external data then read by onnxruntime from the file: ``graph.evaluate``)."""
    scores, _ = _best(onnx_model, [(c.tensor, c.shape, c.prefix_macs) for c in candidates], tflite, xs, macs_rtol)
    matches: list[Match] = []
    for c in candidates:
        best = scores[c.tensor]
        if best is None:
            matches.append(Match(c, None, 0.0, f"fused away by the converter: no int8 tensor of shape "
                                               f"{list(_nhwc(c.shape))} after {c.prefix_macs} MACs"))
            continue
        cos, ix = best
        if cos < min_cosine:
            matches.append(Match(c, None, cos, f"fused away by the converter: the closest int8 tensor "
                                               f"({tflite.tensors[ix].name!r}) has cosine {cos:.3f} < {min_cosine}"))
            continue
        if ix in tflite.outputs or ix in tflite.inputs:
            matches.append(Match(c, None, cos, f"fused into the int8 model's {'output' if ix in tflite.outputs else 'input'}"
                                               f" by the converter (tensor {tflite.tensors[ix].name!r}): not an "
                                               "interior point"))
            continue
        if not tflite.is_single_tensor_cut(ix):
            matches.append(Match(c, None, cos, f"not a single-tensor cut of the int8 model (tensor "
                                               f"{tflite.tensors[ix].name!r}: the converter joined ops across it)"))
            continue
        matches.append(Match(c, ix, cos))
    return _resolve(matches, tflite)


def _best(onnx_model: onnx.ModelProto | Path, wants: list[tuple[str, tuple[int, ...], int]], tflite: TfliteGraph,
          xs: np.ndarray, macs_rtol: float, keep: tuple[str, ...] = (), prepack: bool = True,
          folder: Path | None = None) -> tuple[dict[str, tuple[float, int] | None], dict[str, np.ndarray]]:
    """For each ``(tensor, shape, prefix_macs)``: ``(cosine, int8 index)`` of the int8 tensor of the same (NHWC)
    shape after the same MACs whose dequantized values follow the tensor's float values most closely (over all of
    ``xs``), or None when no int8 tensor has that shape and MACs. Beside it, the float values of the tensors
    ``keep`` over all of ``xs`` (stacked), computed in the same runs (``prepack``, ``folder``:
    ``graph.evaluate.tensor_values_each``'s).

    One sample at a time: the cosines are accumulated (dot products and squared norms, float64) as the float model
    and the int8 model run on each sample, and only the int8 tensors some candidate could be are read, one at a
    time. Holding every candidate's and every int8 tensor's values for all samples at once cost ResNet152V2 at 299
    2 GB; so did holding, for one sample, a float64 copy of every candidate and every int8 tensor dequantized. A
    candidate's float64 copy (and its squared norm) is made once per sample and kept only until the last int8
    tensor of its pool has been read (DenseNet-121: 926 pairs, 430 candidates), in one pass from the NCHW values;
    the same numbers as a copy per pair, computed in half the time."""
    produced = [t for t in tflite.tensors if t.index in tflite.producer and not t.constant]
    prefix_macs = {t.index: tflite.prefix_macs(t.index) for t in produced}
    pools = {tensor: [t.index for t in produced if t.shape == _nhwc(shape)
                      and abs(prefix_macs[t.index] - macs) <= macs_rtol * max(1, macs)]
             for tensor, shape, macs in wants}
    readers: dict[int, list[str]] = {}
    for tensor, pool in pools.items():
        for ix in pool:
            readers.setdefault(ix, []).append(tensor)
    sums = {(tensor, ix): np.zeros(3) for tensor, pool in pools.items() for ix in pool}  # a.b, a.a, b.b
    seen = dict.fromkeys(readers, 0)  # samples each int8 tensor had values in (LiteRT may not keep a tensor)
    kept: dict[str, list[np.ndarray]] = {t: [] for t in keep}
    floats = list(dict.fromkeys([*(t for t, p in pools.items() if p), *keep]))
    for float_vals, int8_vals in zip(tensor_values_each(onnx_model, floats, xs, prepack=prepack, folder=folder),
                                     _int8_each(tflite.data, xs, list(readers))):
        for t in keep:
            kept[t].append(float_vals[t])
        wide: dict[str, tuple[np.ndarray, float]] = {}  # a candidate's float64 NHWC copy while an int8 tensor needs it
        left = {tensor: len(pool) for tensor, pool in pools.items()}
        for ix, v in int8_vals:  # one int8 tensor at a time
            seen[ix] += 1
            a = v.astype(np.float64).ravel()
            aa = a @ a
            for tensor in readers[ix]:
                if tensor not in wide:
                    b = litert.nchw_to_nhwc(float_vals[tensor]).astype(np.float64, order="C").ravel()
                    wide[tensor] = b, b @ b
                b, bb = wide[tensor]
                sums[tensor, ix] += (a @ b, aa, bb)
                left[tensor] -= 1
                if not left[tensor]:
                    del wide[tensor]
        del float_vals, wide  # before the next sample's run
    out: dict[str, tuple[float, int] | None] = {}
    for tensor, pool in pools.items():
        scored = [(_cosine(*sums[tensor, ix]), ix) for ix in pool if seen[ix] == len(xs)]
        out[tensor] = max(scored, default=None)
    return out, {t: np.concatenate(v) for t, v in kept.items()}


def _cosine(ab: float, aa: float, bb: float) -> float:
    """graph.evaluate.cosine from the accumulated dot product and squared norms."""
    if aa == 0 or bb == 0:
        return 1.0 if aa == bb else 0.0
    return float(ab / (np.sqrt(aa) * np.sqrt(bb)))


def match_tensors(onnx_model: onnx.ModelProto, tflite: TfliteGraph, xs: np.ndarray, *, min_cosine: float = 0.5,
                  macs_rtol: float = 1e-3, folder: Path | None = None) -> tuple[dict[str, int], np.ndarray]:
    """Every node output of the ONNX model that survives conversion -> the int8 tensor holding it (the same
    rules as for candidates, cut or not; the model's input and output always match). A tensor left out was
    fused into the op that makes a later one; where several compete for one int8 tensor the closest wins.
    Beside it, the float model's output for ``xs``, from the same runs, by a session that does not prepack its
    weights (``graph.evaluate.session_options``; made 1.5 s sooner on VGG-19), as a split's float stages run
    (``surgery.multidevice``), whose reference it is. ``folder``: where the model's external data is (a model
    from ``graph.model.load_mapped``: its file's folder)."""
    from edgeplan.graph.model import GraphView

    view = GraphView(onnx_model)
    ends = {view.input.name: tflite.inputs[0], view.output.name: tflite.outputs[0]}
    inner = [t for t in view.producer if t not in ends and t in view.shapes]
    macs = view.node_macs
    wants = []
    for t in inner:
        a = view.ancestors[view.producer[t]]
        wants.append((t, view.shape(t), sum(m for i, m in enumerate(macs) if (a >> i) & 1)))
    scores, kept = _best(onnx_model, wants, tflite, xs, macs_rtol, keep=(view.output.name,), prepack=False,
                         folder=folder)
    best: dict[int, tuple[float, str]] = {}
    for t in inner:
        found = scores[t]
        if found is not None and found[0] >= min_cosine and found[1] not in ends.values():
            cos, ix = found
            if ix not in best or cos > best[ix][0]:
                best[ix] = (cos, t)
    return {**{t: ix for ix, (_, t) in best.items()}, **ends}, kept[view.output.name]


def _resolve(matches: list[Match], tflite: TfliteGraph) -> list[Match]:
    """One ONNX candidate per TFLite tensor (the most similar), and matches in the same order on both sides."""
    best: dict[int, Match] = {}
    for m in matches:
        if m.tflite_index is not None and (m.tflite_index not in best or m.cosine > best[m.tflite_index].cosine):
            best[m.tflite_index] = m
    out: list[Match] = []
    last_size = -1
    for m in matches:
        if m.tflite_index is None:
            out.append(m)
            continue
        winner = best[m.tflite_index]
        if winner is not m:
            out.append(Match(m.candidate, None, m.cosine,
                             f"fused away by the converter: its int8 tensor is that of {winner.candidate.tensor!r}, "
                             f"which follows it more closely (cosine {winner.cosine:.3f} vs {m.cosine:.3f})"))
            continue
        size = bin(tflite.prefix_ops(m.tflite_index)).count("1")
        if size <= last_size:
            out.append(Match(m.candidate, None, m.cosine, "out of order in the int8 model"))
            continue
        last_size = size
        out.append(m)
    return out

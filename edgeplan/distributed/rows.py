"""Row slices of tensors as a rank of a spatial split holds them (numpy only: the rank program imports it).

A tile computes rows of a tensor along one axis (H or W of NHWC); a rank keeps the rows its tile got right,
receives the rows its next tile reads and does not hold, and sends rows others read. ``take`` assembles a band
of rows from whatever pieces hold it; a row no piece holds is an error, never zero-filled.
"""
from __future__ import annotations

import numpy as np


class MissingRows(Exception):
    pass


class Rows:
    def __init__(self, axis: int):
        self.axis = axis
        self.pieces: dict[str, list[tuple[int, np.ndarray]]] = {}

    def add(self, name: str, start: int, value: np.ndarray) -> None:
        self.pieces.setdefault(name, []).append((start, value))

    def take(self, name: str, s: int, e: int) -> np.ndarray:
        """Rows ``[s, e)`` of ``name``: a view when one piece holds them all (contiguous for H of a batch of
        one), else a copy joined from several."""
        parts, pos = [], s
        pieces = self.pieces.get(name, [])
        while pos < e:
            best = None
            for start, v in pieces:
                end = start + v.shape[self.axis]
                if start <= pos < end and (best is None or end > best[0]):
                    best = (end, start, v)
            if best is None:
                raise MissingRows(f"rows [{pos}, {e}) of {name!r} are held by no piece here")
            end, start, v = best
            stop = min(end, e)
            parts.append(band(v, pos - start, stop - start, self.axis))
            pos = stop
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=self.axis)
        return np.ascontiguousarray(out)


def keep(value: np.ndarray, out: dict, axis: int) -> np.ndarray:
    """The rows ``out["keep"]`` (global) of a tile's output whose row 0 is global row ``out["offset"]``."""
    s, e = out["keep"]
    return band(value, s - out["offset"], e - out["offset"], axis)


def band(value: np.ndarray, s: int, e: int, axis: int) -> np.ndarray:
    """``value``'s rows ``[s, e)`` along ``axis``, a view."""
    index = [slice(None)] * value.ndim
    index[axis] = slice(s, e)
    return value[tuple(index)]

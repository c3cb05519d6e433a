"""The latency predictor (FlashMem §4.2's XGBoost regression, applied to whole segments): graph features of a
segment, a thread count and a device class -> CPU latency.

Two parts. A **base**: the segment's time as a sum of costs per unit of what it asks (MACs per convolution kind and
of the fully connected ops, activation bytes per op family, the average pools' output elements, ops,
parameter bytes, a constant), the non-negative unit costs fitted per thread count by least squares on relative errors,
those at more threads bounded by those at the fewest (``thread_bounds``: at n threads a kernel takes between 1/n
of and all its time).
Additive and non-negative, it extrapolates to a new architecture as a sum of kernels it has seen priced: left out
in turn, the 16 training architectures are predicted at a median 5-6 % (the trees alone: 14 %). One op count, not
one per family: a family only one training network has took up that network's unexplained time (Xception's 11
RELU ops priced at ~4 ms each, NASNetMobile left out then predicted at 2.3x). Then **XGBoost** (five boosters,
seeds apart, averaged) predicts the logarithm of measured / base from scale-free features (the op mix as
fractions of MACs, of ops and of activation bytes, the convolutions' kernel kinds and MAC-weighted channel and
spatial sizes, bytes per MAC, the segment's size on a log scale, threads and cores): what the sum misses, shapes
that run faster or slower per unit. Trees do not extrapolate, so they never see raw sizes as their target, and a
prediction takes half their correction (``TREE_WEIGHT``). The base is fitted on the segments and, at half their
weight (``BLOCK_WEIGHT``), on the blocks between consecutive cut points (``blocks``): one model's suffixes differ
by the layers between two cuts, which says which kernels its time goes to.

Times are also expressed in units of the speed probe timed in the same rounds (``cpu.PROBE``): a shared
machine's speed drifts by tens of percent between runs, and a prediction for a run scales with that run's
probe (or, with none, the median probe of the training runs).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeplan.artifacts import write_json_atomic
from edgeplan.errors import ProfileError
from edgeplan.profile.features import CONV_KINDS, FAMILY_NAMES
from edgeplan.profile.schema import CpuTiming, Profile

FORMAT = "edgeplan-latency-predictor-4"
# A prediction is the base times exp(TREE_WEIGHT x the trees' log correction): the geometric mean of the base's
# prediction and the base-and-trees' one. Chosen by leave-one-architecture-out over the 16 training networks of
# bench/profiling.py on five days' profiles (median error, mean over the five: weight 0: 6.2 %, 0.25: 5.7 %,
# 0.5: 5.4 %, 0.75: 5.5 %, 1: 5.7 %). Trees do not extrapolate: on InceptionV3 the base alone was within 3-10 %
# (two days' profiles) while the full correction moved its first layers +28 % and its last -10 %.
TREE_WEIGHT = 0.5
MIN_BASE = 1e-4  # probe units (~0.5 us at the reference probe): a base of 0 would make the trees' target infinite
# The base is also fitted on the blocks between consecutive cut points of a model (``blocks``), each at this weight
# beside a segment's 1: a whole segment's time says what a network costs, a block's which of its kernels do.
# Chosen on the training networks only: leave-one-architecture-out over the 16 of bench/profiling.py on the seven
# profile sets its full runs kept (median error, mean over the seven): weight 0 (no blocks) 5.5 %, 0.15: 5.2 %,
# 0.3: 5.0 %, 0.5: 4.9 %, 0.75: 5.0 % (1: above 0.5's on the three sets it was run on).
BLOCK_WEIGHT = 0.5
BLOCK_MIN = 0.1  # of the larger segment's time: a smaller difference is mostly the two timings' noise


def work(f: dict) -> float:
    """The unit the target is normalised by: MACs plus activation bytes read and written."""
    return float(f["macs"] + f["activation_bytes"]) + 1.0


def vector(f: dict, threads: int, cores: int) -> list[float]:
    macs = f["macs"] + 1.0
    ops = max(1, f["ops"])
    v = [
        math.log10(work(f)),
        math.log10(macs),
        f["activation_bytes"] / work(f),
        f["param_bytes"] / macs,
        f["ops"] / (work(f) / 1e6),
        float(threads),
        float(cores),
    ]
    v += [f[f"macs_{fam}"] / macs for fam in FAMILY_NAMES]
    v += [f[f"ops_{fam}"] / ops for fam in FAMILY_NAMES]
    v += [f[f"act_{fam}"] / (f["activation_bytes"] + 1.0) for fam in FAMILY_NAMES]
    v += [f[f"macs_kind_{kind}"] / macs for kind in CONV_KINDS]
    v += [f["wavg_log2_cin"], f["wavg_log2_cout"], f["wavg_log2_hw"], f.get("wavg_log2_in_bytes", 0.0),
          f.get("wavg_log2_out_bytes", 0.0)]
    return v


# Families the base prices by activation bytes. The int8 average pool is priced by its outputs instead: it runs on
# LiteRT's builtin kernel (XNNPACK takes no int8 AVERAGE_POOL_2D), one thread, at 3.1-3.8 ns per output element
# here whatever its window (2x2 stride 2 on 28x28x256: 3.1; 3x3 stride 1 on 35x35x288 and 17x17x768: 3.4; over
# eight shapes from 8x8x2048 to 56x56x32: 3.2-3.8), where per activation byte the first two cost 0.6 and 1.7 ns
# and per window read 0.8 and 0.4. Priced by bytes and window reads,
# the base learned DenseNet's 2x2 pools and under-priced InceptionV3's 3x3 ones by ~40 %.
BYTE_FAMILIES = tuple(fam for fam in FAMILY_NAMES if fam != "avgpool")


def additive(f: dict) -> list[float]:
    """What the base prices, each summed over the segment's ops (``BASE``)."""
    return ([float(f[f"macs_kind_{kind}"]) for kind in CONV_KINDS] + [float(f["macs_fc"])]
            + [float(f[f"act_{fam}"]) for fam in BYTE_FAMILIES]
            + [float(f["avgpool_outputs"]), float(f["ops"]), float(f["param_bytes"]), 1.0])


BASE = ([f"macs_{kind}" for kind in CONV_KINDS] + ["macs_fc"] + [f"act_bytes_{fam}" for fam in BYTE_FAMILIES]
        + ["avgpool_outputs", "ops", "param_bytes", "constant"])


def fit_base(rows: list[list[float]], times: list[float],
             bounds: tuple[list[float], list[float]] | None = None,
             weights: list[float] | None = None) -> list[float]:
    """Non-negative unit costs minimising the squared relative error of their sum against ``times`` (each row's
    squared error times its weight, 1 when ``weights`` is None); within ``(low, high)`` per cost when ``bounds``
    are given (a cost with low == high is fixed there)."""
    from scipy.optimize import lsq_linear, nnls

    x = np.array(rows, dtype=float)
    y = np.array(times, dtype=float)
    scale = x.max(axis=0)
    scale[scale <= 0] = 1.0  # a column no training segment has: its cost stays 0
    w = np.sqrt(np.ones(len(y)) if weights is None else np.array(weights, dtype=float))
    a = x / scale / y[:, None] * w[:, None]
    if bounds is None:
        theta, _ = nnls(a, w, maxiter=50 * x.shape[1])
        return [float(t) for t in theta / scale]
    low, high = (np.array(b, dtype=float) * scale for b in bounds)
    fixed = high <= low
    theta = low.copy()
    if (~fixed).any():
        free = lsq_linear(a[:, ~fixed], w - a[:, fixed] @ low[fixed], bounds=(low[~fixed], high[~fixed]))
        theta[~fixed] = free.x
    return [float(t) for t in theta / scale]


def blocks(data: list[Example], threads: int) -> tuple[list[list[float]], list[float]]:
    """The base's rows and times (probe units) of the blocks between consecutive cut points: of one model's
    segments of one role at ``threads``, in point order, each pair's difference — what the larger runs beyond
    the smaller — when one holds the other (no count of the smaller above the larger's) and the difference is
    at least ``BLOCK_MIN`` of the larger's time."""
    runs: dict[tuple[str, str], list[Example]] = {}
    for e in data:
        if e.threads == threads:
            runs.setdefault((e.model, e.role), []).append(e)
    rows, times = [], []
    for run in runs.values():
        run.sort(key=lambda e: e.point)
        for a, b in zip(run, run[1:]):
            big, small = (a, b) if a.units >= b.units else (b, a)
            d = np.array(additive(big.features)) - np.array(additive(small.features))
            if big.units - small.units >= BLOCK_MIN * big.units and (d >= -1e-9).all():
                rows.append([max(0.0, float(v)) for v in d])
                times.append(big.units - small.units)
    return rows, times


# Terms whose cost per unit may grow with threads (the per-op synchronisation, the weights' packing, the constant);
# the others run at n threads between 1/n of and the same wall time as on the fewest threads trained.
THREAD_FREE = ("ops", "param_bytes", "constant")


def thread_bounds(ref: list[float], ref_threads: int, threads: int, probe_ratio: float) -> tuple[list, list]:
    """Bounds on the unit costs at ``threads`` from those at ``ref_threads`` (``ref``): a kernel split over more
    threads takes at most the time it took and at least its share (``ref_threads / threads`` of it). Costs are in
    units of the probe timed at the same thread count, so wall-time bounds scale by ``probe_ratio`` (the probe at
    ``ref_threads`` over the probe at ``threads``). Fitted freely per thread count instead, the 2-thread costs
    of kernels few training networks have went anywhere: InceptionV3's 1x7 and 7x1 convolutions (only
    InceptionResNetV2 in training has them) priced at 0 on one day's profiles, its average pools (single-threaded)
    at 1.5x their 1-thread time on another's."""
    low = [0.0 if name in THREAD_FREE else t * probe_ratio * ref_threads / threads for name, t in zip(BASE, ref)]
    high = [math.inf if name in THREAD_FREE else t * probe_ratio for name, t in zip(BASE, ref)]
    return low, high


def base_time(base: dict, f: dict, threads: int) -> float:
    """The base's time of a segment with features ``f``, in probe units: the unit costs ``base`` (threads (str)
    -> ``fit_base``'s costs) of ``threads``, or of the nearest thread count there (the most below it, else the
    fewest above)."""
    trained = sorted(int(n) for n in base)
    n = max((t for t in trained if t <= threads), default=trained[0])
    return max(MIN_BASE, float(np.dot(additive(f), base[str(n)])))


FEATURES = (["log10_work", "log10_macs", "act_share", "param_bytes_per_mac", "ops_per_mwork", "threads", "cores"]
            + [f"mac_share_{fam}" for fam in FAMILY_NAMES] + [f"op_share_{fam}" for fam in FAMILY_NAMES]
            + [f"act_share_{fam}" for fam in FAMILY_NAMES] + [f"mac_share_{kind}" for kind in CONV_KINDS]
            + ["wavg_log2_cin", "wavg_log2_cout", "wavg_log2_hw", "wavg_log2_in_bytes", "wavg_log2_out_bytes"])


@dataclass(frozen=True)
class Example:
    model: str
    point: int
    role: str
    threads: int
    cores: int
    features: dict
    ms: float
    probe_ms: float | None = None  # the speed probe at the speed ``ms`` is expressed at (raw probe x scale)

    @property
    def units(self) -> float:
        """Its time in probe units (``ms`` when there is no probe): what the base is fitted on."""
        return self.ms / (self.probe_ms or 1.0)


def examples(profiles: list[Profile], cores: int | None = None) -> list[Example]:
    """Every measured CPU timing in ``profiles`` (prefixes timed on the CPU included)."""
    out = []
    for p in profiles:
        for s in p.segments:
            if s.status != "ok" or not s.features:
                continue
            missing = [k for k in [f"ops_{fam}" for fam in FAMILY_NAMES] + ["avgpool_outputs"] if k not in s.features]
            if missing:
                raise ProfileError(f"{p.model}: its profile's segment features predate what this edgeplan's "
                                   f"predictor reads (no {', '.join(missing)}); profile it again")
            for t in s.cpu:
                if t.source == "measured" and t.median_ms > 0:
                    probe = p.probe_ms(t.threads)
                    out.append(Example(p.model, s.point, s.role, t.threads, cores or p.host.cores, s.features,
                                       t.median_ms, probe * t.scale if probe else None))
    return out


@dataclass
class Predictor:
    boosters: list  # trained alike but for their seed; a prediction is their geometric mean
    trained_on: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    probe_ms: dict = field(default_factory=dict)  # threads (str) -> median probe of the training runs
    base: dict = field(default_factory=dict)  # threads (str) -> the base's unit costs (``BASE``), in probe units

    def _scale(self, threads: int, probe_ms: float | None) -> float:
        return probe_ms or self.probe_ms.get(str(threads)) or 1.0

    @classmethod
    def train(cls, data: list[Example], rounds: int = 300, seed: int = 0, members: int = 5,
              tree_weight: float = TREE_WEIGHT, block_weight: float = BLOCK_WEIGHT, **overrides) -> Predictor:
        """Hyper-parameters chosen by leave-one-model-out cross-validation over the four training
        architectures of the profiling issue (never on the held-out ones); see bench/profiling.py. ``members``
        boosters, seeds ``seed``.. (row and column subsampling differ), averaged in log space: one booster's
        held-out error (bench/profiling.py: 16 training architectures; InceptionV3, EfficientNetB0) moved from
        0.099 to 0.121 with its seed alone (seeds 0-6, the same profiles); five, 0.108 and 0.110 over two disjoint
        sets of seeds. ``tree_weight``: how much of the trees' correction a prediction takes (``TREE_WEIGHT``);
        ``block_weight``: the weight of the blocks between cut points in the base's fit (``BLOCK_WEIGHT``, 0: none)."""
        import xgboost as xgb

        if len(data) < 8:
            raise ProfileError(f"training the latency predictor needs at least 8 measured timings, got {len(data)}")
        if not 0.0 <= tree_weight <= 1.0:
            raise ProfileError(f"the latency predictor's tree_weight must be within [0, 1], got {tree_weight}")
        if not block_weight >= 0:  # NaN too
            raise ProfileError(f"the latency predictor's block_weight must be at least 0, got {block_weight}")
        if members < 1:
            raise ProfileError(f"the latency predictor needs at least one booster, got members={members}")
        if any(e.probe_ms is None for e in data) and any(e.probe_ms is not None for e in data):
            raise ProfileError("some training profiles have a speed probe and some do not; re-profile the old ones")
        counts = sorted({e.threads for e in data})
        probes = {str(n): float(np.median([e.probe_ms for e in data if e.threads == n and e.probe_ms]))
                  for n in sorted({e.threads for e in data if e.probe_ms})}
        ref = counts[0]  # the fewest threads: fitted freely, the others bounded by it
        base = {}
        for n in counts:
            rows = [additive(e.features) for e in data if e.threads == n]
            times = [e.units for e in data if e.threads == n]
            weights = [1.0] * len(rows)
            if block_weight > 0:
                more_rows, more_times = blocks(data, n)
                rows, times, weights = rows + more_rows, times + more_times, weights + [block_weight] * len(more_rows)
            bounds = None
            if n != ref:
                bounds = thread_bounds(base[str(ref)], ref, n, probes[str(ref)] / probes[str(n)] if probes else 1.0)
            base[str(n)] = fit_base(rows, times, bounds, weights)
        x = np.array([vector(e.features, e.threads, e.cores) for e in data])
        y = np.array([math.log(e.units / base_time(base, e.features, e.threads)) for e in data])
        params = {"objective": "reg:squarederror", "eta": 0.05, "max_depth": 3, "subsample": 0.8,
                  "colsample_bytree": 0.5, "min_child_weight": 5, "lambda": 1.0, "seed": seed, "nthread": 1,
                  **overrides}
        matrix = xgb.DMatrix(x, label=y, feature_names=FEATURES)
        boosters = [xgb.train({**params, "seed": seed + k}, matrix, num_boost_round=rounds) for k in range(members)]
        return cls(boosters, sorted({e.model for e in data}), {**params, "rounds": rounds, "members": members,
                                                             "tree_weight": tree_weight, "block_weight": block_weight},
                   probes, base)

    def predict_ms(self, features: dict, threads: int, cores: int, probe_ms: float | None = None) -> float:
        return self.predict_many([(features, threads, cores, probe_ms)])[0]

    def predict_many(self, rows: list[tuple[dict, int, int, float | None]]) -> list[float]:
        """``(features, threads, cores, probe_ms of the run or None)`` -> milliseconds."""
        import xgboost as xgb

        x = np.array([vector(f, t, c) for f, t, c, _ in rows])
        matrix = xgb.DMatrix(x, feature_names=FEATURES)
        ratio = np.exp(self.params["tree_weight"] * np.mean([b.predict(matrix) for b in self.boosters], axis=0))
        return [float(r * base_time(self.base, f, t) * self._scale(t, probe))
                for r, (f, t, _, probe) in zip(ratio, rows)]

    def timing(self, features: dict, threads: int, device_class, probe_ms: float | None = None) -> CpuTiming:
        ms = round(self.predict_ms(features, threads, device_class.cores, probe_ms), 5)
        return CpuTiming(threads=threads, source="predicted", median_ms=ms, mean_ms=ms, p90_ms=ms, mad_ms=0.0)

    def save(self, path: str | Path) -> None:
        raw = [json.loads(b.save_raw(raw_format="json").decode()) for b in self.boosters]
        write_json_atomic(path, {"format": FORMAT, "features": FEATURES, "trained_on": self.trained_on,
                                 "params": self.params, "probe_ms": self.probe_ms,
                                 "base_terms": BASE, "base": self.base,
                                 "target": "log(ms / probe_ms / base)",
                                 "boosters": raw})

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        import xgboost as xgb

        path = Path(path)
        if not path.is_file():
            raise ProfileError(f"{path}: no such predictor file (train one with `edgeplan profile train`)")
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("features") != FEATURES or data.get("base_terms") != BASE:
            raise ProfileError(f"{path}: a predictor of another format or feature set "
                               f"({data.get('format')!r}); retrain it with this edgeplan")
        params = data.get("params")
        weight = params.get("tree_weight") if isinstance(params, dict) else None
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0.0 <= weight <= 1.0:
            raise ProfileError(f"{path}: its tree_weight is missing or not within [0, 1]; retrain it")
        raw = data.get("boosters")
        if not isinstance(raw, list) or not raw or not all(isinstance(b, dict) for b in raw):
            raise ProfileError(f"{path}: its boosters are missing or malformed; retrain it")
        boosters = []
        for k, b in enumerate(raw):
            booster = xgb.Booster()
            try:
                booster.load_model(bytearray(json.dumps(b).encode()))
            except xgb.core.XGBoostError:
                raise ProfileError(f"{path}: its booster {k} is not an XGBoost model; retrain it") from None
            boosters.append(booster)
        base = data.get("base")
        if not isinstance(base, dict) or not base or any(
                not str(n).isdigit() or not isinstance(v, list) or len(v) != len(BASE)
                or not all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in v)
                for n, v in base.items()):
            raise ProfileError(f"{path}: its base (unit costs per thread count) is missing or malformed; retrain it")
        return cls(boosters, data["trained_on"], params, data.get("probe_ms", {}), base)


def mape(predicted: list[float], measured: list[float]) -> float:
    return float(np.mean([abs(p - m) / m for p, m in zip(predicted, measured)]))

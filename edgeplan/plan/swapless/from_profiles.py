"""A ``ModelSpec`` from a model's profile on a device class (ms -> s; DESIGN.md's definitions):
s^TPU = tpu_compute_ms, d/B = io_ms, T^Load = load_ms, footprint = on-chip parameter bytes, s^CPU = the
suffix on one thread. Standard library only."""
from __future__ import annotations

from edgeplan.errors import ProfileError
from edgeplan.plan.swapless.instance import ModelSpec
from edgeplan.profile.schema import Profile


def model_spec(name: str, rate: float, profile: Profile, where: str = "", edgetpu: bool = True,
               excluded: tuple[int, ...] = ()) -> ModelSpec:
    """``edgetpu`` False: the class has no Edge TPU, so no prefix is usable (never chosen: every model runs wholly
    on the CPU, point 0, and SwapLess still shares the cores between them). ``excluded``: points > 0 the accuracy
    gate refused, never chosen either (point 0 cannot be: the caller refuses a model whose point 0 failed)."""
    P = profile.last_point
    s_tpu, io, load, foot, s_cpu, tpu_samples, cpu_samples = [0.0], [0.0], [0.0], [0], [], [()], []
    for p in range(P + 1):
        if p > 0 and (not edgetpu or p in excluded):
            s_tpu.append(float("inf"))
            io.append(0.0)
            load.append(0.0)
            foot.append(0)
            tpu_samples.append(())
        elif p > 0:
            pre = profile.segment(p, "prefix")
            if pre is None or pre.status != "ok" or pre.tpu is None:
                raise ProfileError(f"{where or profile.model}: no TPU time for the prefix of point {p} "
                                   f"({'missing' if pre is None else pre.status}); re-run `edgeplan profile run`")
            t = pre.tpu
            # a prefix with ops the Edge TPU does not run is not a TPU prefix: unusable (never chosen)
            s_tpu.append(t.tpu_compute_ms / 1e3 if t.tpu_ops == t.total_ops else float("inf"))
            io.append(t.io_ms / 1e3)
            load.append(t.load_ms / 1e3)
            foot.append(t.onchip_param_bytes)
            tpu_samples.append(tuple(x / 1e3 - t.io_ms / 1e3 for x in t.samples_ms))
        if p < P:
            suf = profile.segment(p, "suffix")
            ms = suf.cpu_ms(1) if suf is not None and suf.status == "ok" else None
            if ms is None:
                raise ProfileError(f"{where or profile.model}: no one-thread CPU time for the suffix of point {p} "
                                   f"({'missing' if suf is None else suf.status}); re-run `edgeplan profile run`")
            s_cpu.append(ms / 1e3)
            cpu_samples.append(tuple(x / 1e3 for x in suf.cpu_timing(1).samples_ms))
        else:
            s_cpu.append(0.0)
            cpu_samples.append(())
    return ModelSpec(name, rate, tuple(s_tpu), tuple(io), tuple(load), tuple(foot), tuple(s_cpu),
                     tuple(tpu_samples), tuple(cpu_samples))

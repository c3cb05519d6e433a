"""``edgeplan units`` and ``edgeplan split``: one model over several devices (AutoDiCE's front end)."""
from __future__ import annotations

import json
from pathlib import Path

from edgeplan.console import out, table


def cmd_units(args, params) -> int:
    from edgeplan.pipeline.multidevice import find_units
    from edgeplan.quantize.tflite_graph import TfliteGraph

    root = Path(args.artifact_dir)
    us = find_units(root, params)
    graph = TfliteGraph((root / "model_int8.tflite").read_bytes())
    rows = [{"unit": u.index, "layers": list(u.names), "int8_ops": [graph.ops[o].name for o in u.ops],
             "macs": sum(graph.op_macs[o] for o in u.ops),
             "int8_param_bytes": sum(graph.op_param_bytes[o] for o in u.ops)} for u in us.units]
    if args.json:
        out.print_json(json.dumps(rows))
        return 0
    t = table(f"Units of {root}: the layers a mapping must keep together (one int8 op or fused run each)",
              ("unit", "layers", "int8 ops", "MMACs", "params KB"), right=("unit", "MMACs", "params KB"))
    for r in rows:
        names = ", ".join(r["layers"])
        t.add_row(str(r["unit"]), names if len(names) < 60 else names[:57] + "...", " ".join(r["int8_ops"]),
                  f"{r['macs'] / 1e6:.1f}", f"{r['int8_param_bytes'] / 1e3:.1f}")
    out.print(t)
    out.print(f"{len(us.units)} units of {sum(len(u.names) for u in us.units)} layers; a mapping is JSON "
              "{\"<device>_<arch><cores>\": \\[layer, ...], ...} (README: One model over several devices)", highlight=False)
    return 0


def cmd_split(args, params) -> int:
    from edgeplan.errors import SpecError
    from edgeplan.pipeline.multidevice import platform_for, split

    root = Path(args.artifact_dir)
    platform = platform_for(params, args.platform, args.deployment)
    if args.out:
        dest = Path(args.out)
    elif args.deployment:
        dest = Path(args.artifacts) / "deployments" / args.deployment / "multidevice"
    else:
        raise SpecError("give --out DIR (or --deployment NAME: artifacts/deployments/NAME/multidevice)")
    summary = split(root, params, Path(args.mapping), platform, dest)
    t = table(f"Split of {root} over {summary['ranks']} ranks ({summary['units']} units, {summary['stages']} stages)",
              ("rank", "key", "stages", "MMACs", "int8 params MB"), right=("rank", "stages", "MMACs", "int8 params MB"))
    for r in summary["per_rank"]:
        t.add_row(str(r["rank"]), r["key"], str(r["stages"]), f"{r['macs'] / 1e6:.1f}", f"{r['int8_param_bytes'] / 1e6:.2f}")
    out.print(t)
    v = summary["verify"]
    out.print(f"{summary['buffers']} buffers between ranks ({summary['buffer_bytes'] / 1e3:.1f} KB per frame); verified: "
              f"float chain max |diff| {v['float_max_abs_diff']:.2g} (bound {v['float_bound']:.2g}), int8 chain "
              f"identical (reference {v['int8_identical_reference']:.0%}, XNNPACK {v['int8_identical_xnnpack']:.0%}); "
              f"split {summary['split_s']:.2f} s, with verification {summary['total_s']:.2f} s")
    out.print(f"wrote {dest} (tables.json, rankfile, hostfile, int8/, float/)")
    return 0


def cmd_devices(args, params) -> int:
    from edgeplan.distributed import emulate
    from edgeplan.pipeline.multidevice import platform_for

    if args.devices_cmd == "down":
        removed = emulate.down(args.deployment)
        out.print(f"removed {', '.join(removed)}" if removed else f"no emulated hosts for {args.deployment!r}")
        return 0
    if args.devices_cmd == "status":
        st = emulate.load(args.deployment)
        t = table(f"Emulated hosts of {args.deployment} ({st['subnet']})", ("device", "address", "netns", "cores",
                  "cpu quota", "link Mbit/s", "sent MB", "received MB"), right=("cores", "cpu quota", "link Mbit/s",
                                                                                 "sent MB", "received MB"))
        counts = emulate.link_bytes(st)
        for h in st["hosts"]:
            c = counts[h["device"]]
            t.add_row(h["device"], h["address"], h["netns"], str(h["cores"]), str(h["cpu_quota"] or "-"),
                      f"{h['net_bytes_per_s'] * 8 / 1e6:g}" if h["net_bytes_per_s"] else "unshaped",
                      f"{c['tx'] / 1e6:.2f}", f"{c['rx'] / 1e6:.2f}")
        out.print(t)
        return 0
    platform = platform_for(params, args.platform, args.deployment)
    emulated = emulate.up(args.deployment, platform, args.subnet)
    where = emulate.state_dir(args.deployment)
    out.print(f"{len(emulated.devices)} hosts up on {args.subnet}: "
              + ", ".join(f"{d.name} {d.host}" for d in emulated.devices))
    out.print(f"their platform (hosts = emulated addresses): {where / 'platform.txt'} — split with it "
              f"(`edgeplan split ... --platform {where / 'platform.txt'}`) and run with "
              f"`edgeplan-runtime mpi run DIR --emulated {args.deployment}`; remove with `edgeplan devices down "
              f"--deployment {args.deployment}`")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("units", help="the layers of ARTIFACT_DIR's model a multi-device mapping keeps together",
                        description="Matches every ONNX tensor to the int8 model: layers the converter fused into "
                        "one op (a convolution with its batch norm and activation) form a unit, which one mapping "
                        "key must hold whole.")
    sp.add_argument("artifact_dir", help="artifacts/NAME/VERSION (model.onnx and model_int8.tflite)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=cmd_units)
    sp = sub.add_parser("split", help="split ARTIFACT_DIR's model over several devices by a mapping (AutoDiCE)",
                        description="Validates the mapping (JSON {\"<device>_<arch><cores>\": [layer, ...]}: keys in "
                        "rank order, every layer once, units whole) against the platform, cuts per-rank stages "
                        "(int8 TFLite and float ONNX), writes the communication tables, rankfile and hostfile, and "
                        "verifies the chain in this process (float within 1e-4 x max(1, max|y|), int8 identical "
                        "with both kernel sets) before writing anything.")
    sp.add_argument("artifact_dir", help="artifacts/NAME/VERSION (model.onnx and model_int8.tflite)")
    sp.add_argument("--mapping", required=True, help="the mapping spec (JSON)")
    sp.add_argument("--platform", help="the platform spec: the paper's text format (one device per line: name, arch, "
                    "slots=0-1, host=..., net=bytes/s, power=idle/active W, quota=cores) or JSON")
    sp.add_argument("--deployment", help="take the platform from the fleet registry's devices of this deployment and "
                    "write to ARTIFACTS/deployments/NAME/multidevice")
    sp.add_argument("--artifacts", default="artifacts", help="artifact root for --deployment (default: artifacts)")
    sp.add_argument("--out", help="output directory (replaced only once the new split verifies)")
    sp.set_defaults(func=cmd_split)
    sp = sub.add_parser("devices", help="emulated hosts for a multi-device deployment on this machine (root)",
                        description="up: one network + UTS namespace per device (its own hostname), a cpu cgroup "
                        "(cpu_quota x cores), a veth to a bridge namespace shaped with tbf both ways at the device's "
                        "net_bytes_per_s; everything made is recorded and `down` removes exactly that.")
    dsub = sp.add_subparsers(dest="devices_cmd", required=True)
    for verb, text in (("up", "build the hosts"), ("down", "remove everything up made"),
                       ("status", "the hosts and the bytes each link has carried")):
        d = dsub.add_parser(verb, help=text)
        d.add_argument("--deployment", required=True, help="the deployment (its devices in the fleet registry, or "
                       "--platform)")
        if verb == "up":
            d.add_argument("--platform", help="a platform spec instead of the registry's devices")
            d.add_argument("--subnet", default="10.213.0.0/24", help="the hosts' private subnet (default 10.213.0.0/24)")
        d.set_defaults(func=cmd_devices)

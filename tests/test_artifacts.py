"""Artifact records: JSON round trip, and a clear refusal of another schema version."""
from __future__ import annotations

import json

import pytest

from edgeplan.artifacts import Analysis, CompileReport, DroppedPoint, OperatorRow, Point
from edgeplan.errors import ArtifactError


def test_round_trip(tmp_path):
    a = Analysis(model_sha256="ab" * 32, points=(Point(0, "x", "x:0", 0, 0, 12, (1, 3, 2, 2)),
                                               Point(1, "y", "y:0", 100, 1000, 10, (1, 10), "fc")),
                 dropped=(DroppedPoint("z", "fused away"),), max_points=8, complete=True, onnx_candidates=2)
    a.save(tmp_path / "analysis.json")
    assert Analysis.load(tmp_path / "analysis.json") == a
    r = CompileReport("emulated", "v", "m", 1, 2, 3, 1, 5, 4, 1, (OperatorRow("CONV_2D", 4, "Mapped to Edge TPU"),))
    r.save(tmp_path / "compile.json")
    assert CompileReport.load(tmp_path / "compile.json") == r


def test_other_schema_version_is_refused_with_the_path(tmp_path):
    p = tmp_path / "analysis.json"
    p.write_text(json.dumps({"schema_version": 99, "model_sha256": "", "points": []}))
    with pytest.raises(ArtifactError, match=r"analysis.json: Analysis schema_version 99"):
        Analysis.load(p)
    p.write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Analysis.load(p)

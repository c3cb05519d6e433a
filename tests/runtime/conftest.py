"""A real compiled deployment (tiny_cnn on coral-usb-emulated: EMULATED Edge TPU) published to a store, for
the runtime to pull and serve."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.publish import publish
from edgeplan.profile import fleet
from edgeplan.store import open_store


@dataclass
class Published:
    root: Path  # artifacts
    params: dict
    store_uri: str
    key: keys.SigningKey
    trusted_dir: Path

    @property
    def trusted(self) -> dict:
        return keys.load_trusted([self.trusted_dir])

    def publish(self, bundle=None):
        """Publish the deployment ``solo`` (or ``bundle``) as the next revision."""
        bundle = bundle or build(self.root, "solo", self.params)
        devices = [d for d in fleet.load(self.params).devices if d.deployment == "solo"]
        return publish(open_store(self.store_uri), bundle, self.key, self.trusted, devices)

    def second_revision(self) -> None:
        """Publish a revision 2 that differs from revision 1 in the plan only (its expected rate): one blob."""
        import json

        from edgeplan.pipeline.planning import plan_swapless

        params = json.loads(json.dumps(self.params))
        params["deployments"][0]["models"][0]["rate"] = 80.0
        plan_swapless(self.root, "solo", params)
        try:
            result = self.publish(build(self.root, "solo", params))
        finally:
            plan_swapless(self.root, "solo", self.params)  # the session's artifacts as they were
        assert result.revision == 2 and result.uploaded_blobs == 1


@pytest.fixture
def published(deployment_root, tmp_path) -> Published:
    root, params = deployment_root
    _, key_path, _ = keys.generate(tmp_path / "keys")
    p = Published(root, params, str(tmp_path / "store"), keys.load_signing_key(key_path), tmp_path / "keys")
    p.publish()
    return p

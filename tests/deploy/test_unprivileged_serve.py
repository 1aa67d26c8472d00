"""A bundle built as root is served and searched by an unprivileged uid (what the image's and the
chart's non-root user meets): the real ``esp serve`` under ``setpriv`` as uid 65534 on loopback.

The bundle is the one training exports (``tiny_bundle``: safetensors write their files 0600),
copied with its modes kept; a bundle another writer left private is refused by name, and the
served bundle stays.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.live_server import start_server
from esp_retrieval.client.client import ESPClient, ESPError

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(
    SETPRIV is None or not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root and setpriv (util-linux) to serve as another uid",
)
TOKEN = "unprivileged-admin-token"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder uid 65534 can enter (pytest's own temporary folders are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="esp-unprivileged-"))
    os.chmod(path, 0o755)
    home = path / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.live
def test_a_bundle_built_as_root_is_searched_by_uid_65534(tiny_bundle: Path, shared_dir: Path) -> None:
    assert os.stat(tiny_bundle).st_uid == 0
    bundle = shared_dir / "bundle"
    shutil.copytree(tiny_bundle, bundle)  # modes as training wrote them
    wrapper = [str(SETPRIV), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    with start_server(bundle, shared_dir / "server.log", wrapper=wrapper, token=TOKEN,
                      env={"HOME": str(shared_dir / "home")}, args=["--log-level", "warning"]) as server:
        uid_line = next(line for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines()
                        if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(NOBODY)] * 4  # real, effective, saved, file-system uid
        with ESPClient(server.url, admin_token=TOKEN) as client:
            served = client.ready().bundle_version
            res = client.search(["river bank"], k=3)  # a text query: the encoder was read
            assert res.bundle_version == served and len(res.results[0].hits) == 3

            private = shared_dir / "private"
            shutil.copytree(tiny_bundle, private)
            os.chmod(private / "encoder" / "heads.safetensors", 0o600)  # what an older writer left
            with pytest.raises(ESPError) as err:
                client.reload(str(private))
            assert err.value.status == 409
            assert "'encoder/heads.safetensors': not readable by uid 65534" in err.value.message
            assert "chmod -R a+rX,go-w" in err.value.message
            assert client.ready().bundle_version == served
            assert client.search(["river bank"], k=1).bundle_version == served

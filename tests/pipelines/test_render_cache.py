"""``sublimate run NAME`` takes the rendered pipeline from the user's cache (``render``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sublimate.pipelines import render
from sublimate.pipelines.render import PIPELINES, rendered_cache
from tests.conftest import REPO

# Renders the pipeline as `sublimate run NAME` does; says whether Hera was imported for it.
PROBE = """
import json, sys
from sublimate.pipelines.render import runnable_dict
document = runnable_dict(sys.argv[1])
print(json.dumps({"hera": "hera" in sys.modules, "document": document}))
"""


def _run_dict(pipeline: str, cache: Path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, pipeline], capture_output=True,
                          text=True, check=True, cwd=REPO,
                          env={**os.environ, "XDG_CACHE_HOME": str(cache), **env})
    return json.loads(done.stdout)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_a_cached_pipeline_is_the_one_rendered_and_needs_no_hera(pipeline: str,
                                                                 tmp_path: Path) -> None:
    first = _run_dict(pipeline, tmp_path)
    assert first["hera"]  # rendered: nothing was cached yet
    (kept,) = (tmp_path / "sublimate/rendered").glob(f"{pipeline}-*.json")
    second = _run_dict(pipeline, tmp_path)
    assert not second["hera"]
    assert second["document"] == first["document"]
    # and the same as rendering with no cache at all
    assert _run_dict(pipeline, tmp_path, SUBLIMATE_RENDER_CACHE="0")["document"] == \
        first["document"]
    assert json.loads(kept.read_text()) == first["document"]


def test_a_changed_source_file_is_another_key(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    before = rendered_cache("train")
    assert before is not None and before.parent == tmp_path / "sublimate/rendered"
    source = Path(render.__file__)
    info = source.stat()
    try:
        os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
        assert rendered_cache("train") != before
    finally:
        os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert rendered_cache("train") == before
    assert rendered_cache("sweep") != before  # one file per pipeline


def test_a_broken_cache_file_is_rendered_again(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kept = rendered_cache("train")
    assert kept is not None
    kept.parent.mkdir(parents=True)
    kept.write_text('{"apiVersion": ')  # cut short
    document = render.runnable_dict("train")
    assert document["metadata"]["name"] == "sublimate-train"
    assert json.loads(kept.read_text()) == document

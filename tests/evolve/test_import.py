"""`import evolve` stays fast, silent and offline: no heavy imports, no output, no files written."""

import json
import os
import subprocess
import sys

HEAVY = [
    "torch",
    "transformers",
    "peft",
    "litellm",
    "chromadb",
    "sentence_transformers",
    "dspy",
    "docker",
    "numpy",
    "typer",
    "rich",
    "safetensors",
    "httpx",
    "requests",
    "mlflow",
    "wandb",
    "opentelemetry",
    "grpc",
    "ray",
    "starlette",
    "uvicorn",
    "plotly",
    "playwright",
]

PROBE = f"""
import sys, time, json
t = time.perf_counter()
import evolve
dt = time.perf_counter() - t
_ = evolve.__version__, evolve.__all__
print(json.dumps({{"seconds": dt, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def test_import_is_light_silent_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("EVOLVE_CACHE_DIR", None)
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    out = json.loads(r.stdout)
    assert out["loaded"] == [], f"import evolve pulled in {out['loaded']}"
    assert out["seconds"] < 0.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert list(home.iterdir()) == []


def test_lazy_public_api_resolves():
    import evolve

    for name in evolve.__all__:
        assert getattr(evolve, name) is not None

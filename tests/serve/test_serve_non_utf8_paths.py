"""What is served, named by a path whose bytes are not UTF-8 (Python decodes them as lone surrogates,
``caf\\udce9``): every answer that names it is text, each such byte shown as U+FFFD. /v1/models, /api/info and
every non-streamed /v1 reply (whose ``model`` is the run directory's name) were 500s, JSON's UTF-8 holding no
surrogate; a stream sent ``"caf\\udce9"``, an escape strict JSON clients refuse; /api/metrics the same for a
metrics file under such a directory."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gptforge.serve.app import ServeSettings, create_app  # noqa: E402
from tests.serve.answering import T, answering_model  # noqa: E402

NAME = os.fsdecode(b"caf\xe9-run")  # the name a Linux filesystem gives Python for these bytes
SHOWN = "caf\ufffd-run"


@pytest.fixture(scope="module")
def client(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / NAME
    folder.mkdir()
    metrics = folder / "metrics.jsonl"
    metrics.write_text(json.dumps({"kind": "train", "step": 1, "loss": 2.0}) + "\n")
    served = {"source": "ckpt", "path": str(folder / "checkpoints" / "step_00000001"), "run_dir": str(folder),
              "step": 1}
    app = create_app(answering_model(64), tokenizer, ServeSettings(max_new_tokens_cap=4), chat_template=T.to_dict(),
                     served=served, metrics_path=metrics)
    with TestClient(app) as c:
        yield c, folder


def _no_surrogate(text: str) -> None:
    assert "\\ud" not in text.lower() and text.encode("utf-8"), text[:300]


def test_every_answer_naming_the_path_is_text(client):
    c, folder = client
    r = c.get("/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == SHOWN, r.text
    assert c.get(f"/v1/models/{SHOWN}").status_code == 200  # the name listed is the name a client can ask for
    info = c.get("/api/info")
    assert info.status_code == 200 and info.json()["served"]["run_dir"].endswith("/" + SHOWN), info.text
    r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == SHOWN, r.text
    r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.status_code == 200 and chunks and all(x["model"] == SHOWN for x in chunks), r.text
    _no_surrogate(r.text)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == SHOWN, r.text
    r = c.get("/api/metrics")
    assert r.status_code == 200 and r.json()["path"].endswith(f"/{SHOWN}/metrics.jsonl"), r.text
    assert r.json()["train"] == [[1, 2.0]]


def test_readable_reaches_keys_lists_and_the_tokenizers_name():
    from types import SimpleNamespace

    from gptforge.serve.app import tokenizer_fields
    from gptforge.serve.describe import readable

    assert readable({"a": [NAME, 1, None], NAME: "ok \u00e9"}) == {"a": [SHOWN, 1, None], SHOWN: "ok \u00e9"}
    assert readable("\ud800x") == "\ufffdx" and readable(None) is None
    assert tokenizer_fields(SimpleNamespace(name=NAME, n_vocab=2, eot_token=1))["name"] == SHOWN

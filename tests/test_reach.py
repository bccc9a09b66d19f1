"""Nothing a visitor sends reaches what it should not (issue 24, item 5).

- /compare: every parameter that could name a model, a file or a directory is a choice among configured
  names (Gradio refuses anything else), and a file parameter that names a server path instead of an upload
  is refused (Gradio moves only files a user uploaded into its cache).
- /gradio_api/file= serves neither the repository's own files nor system files.
- Models load with trust_remote_code=False and from safetensors only; a pytorch_model.bin is never read.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import app_server
import pytest
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server():
    return app_server.launch()


@pytest.fixture(scope="module")
def parameters(server) -> list[dict]:
    api = Client(server.url, verbose=False).view_api(return_format="dict", print_info=False)
    return api["named_endpoints"]["/compare"]["parameters"]


def raw_compare(server, parameters, **values) -> tuple[str, dict | None]:
    """/compare through Gradio's plain HTTP API with a hand-written body: (last event name, its data)."""
    defaults = dict(image=None, video=None, prompt="Describe it.", max_new_tokens=4, policy="chain")
    data = [values.get(p["parameter_name"], defaults.get(p["parameter_name"], p.get("parameter_default")))
            for p in parameters]
    req = urllib.request.Request(f"{server.url}/gradio_api/call/compare", json.dumps({"data": data}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        event_id = json.loads(r.read())["event_id"]
    with urllib.request.urlopen(f"{server.url}/gradio_api/call/compare/{event_id}", timeout=120) as r:
        lines = r.read().decode().splitlines()
    events = [(a[7:], b[6:]) for a, b in zip(lines, lines[1:]) if a.startswith("event: ") and b.startswith("data: ")]
    name, data = events[-1]
    return name, json.loads(data)


def file_data(path: str) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


NAMES = ["/etc/passwd", str(ROOT / "assets" / "models" / "tinyworld-target"), "assets/models/tinyworld-draft",
         "Qwen/Qwen2.5-VL-7B-Instruct", "../../etc", str(ROOT)]


@pytest.mark.parametrize("value", NAMES)
def test_no_parameter_names_a_model_path_or_repo(server, parameters, value):
    """Every text parameter but the prompt is a dropdown of configured names: paths and repo ids are refused."""
    kinds = {p["parameter_name"]: p["component"] for p in parameters}
    assert set(kinds.values()) <= {"Image", "Video", "Textbox", "Slider", "Dropdown", "Checkbox"}, kinds
    assert [n for n, k in kinds.items() if k == "Textbox"] == ["prompt"]  # the only free text: never a path
    dropdowns = [n for n, k in kinds.items() if k == "Dropdown"]
    assert set(dropdowns) == {"policy", "preset", "alpha_source", "threshold", "draw"}, dropdowns
    for name in dropdowns:
        event, data = raw_compare(server, parameters, **{name: value})
        # the policy also takes a spec with knobs (chain:k=3): anything else is refused as an unknown policy
        refusal = "unknown policy" if name == "policy" else "not in the list of choices"
        assert event == "error" and refusal in data["error"] and "\n" not in data["error"], (name, data)


@pytest.mark.parametrize("path", [str(ROOT / "app.py"), "/etc/passwd", str(ROOT / "assets" / "models"),
                                  str(ROOT / "assets" / "examples" / "shapes_1.png")])
def test_file_parameters_take_uploads_only(server, parameters, path):
    """A file parameter naming a server path (a source file, a system file, a directory, even a shipped
    example) is refused; the same request with an uploaded file runs (the control)."""
    for kind in ("image", "video"):
        event, data = raw_compare(server, parameters, **{kind: file_data(path)})
        assert event == "error", (kind, path, data)
    boundary = "sage-test-boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"x.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n")
    image = (ROOT / "assets" / "examples" / "shapes_1.png").read_bytes()
    body = head.encode() + image + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"{server.url}/gradio_api/upload", body,
                                 {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req) as r:
        uploaded = json.loads(r.read())[0]
    event, data = raw_compare(server, parameters, image=file_data(uploaded))
    assert event == "complete", data


@pytest.mark.parametrize("path", [str(ROOT / "app.py"), "app.py", str(ROOT / "sage_engine" / "models" / "loading.py"),
                                  "sage_engine/models/loading.py", str(ROOT / "README.md"),
                                  str(ROOT / ".git" / "config"),
                                  str(ROOT / "assets" / "models" / "tinyworld-target" / "config.json"),
                                  "/etc/passwd", "../../../../etc/passwd", "%2Fetc%2Fpasswd"])
def test_file_route_serves_no_source_or_system_file(server, path):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server.url}/gradio_api/file={path}")
    assert e.value.code in (403, 404), (path, e.value.code)


# ---------------------------------------------------------------- model loading, no server


def test_models_load_without_remote_code_and_from_safetensors_only(saved_qwen_pair, monkeypatch):
    import transformers

    from sage_engine import load_pair

    calls = []
    for cls in (transformers.AutoProcessor, transformers.AutoModelForImageTextToText):
        original = cls.from_pretrained.__func__

        def spy(klass, name, *args, _original=original, _cls=cls.__name__, **kwargs):
            calls.append((_cls, kwargs))
            return _original(klass, name, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    target, draft = saved_qwen_pair
    load_pair(target=target, draft=draft)
    assert {c for c, _ in calls} == {"AutoProcessor", "AutoModelForImageTextToText"} and len(calls) == 4
    for cls, kwargs in calls:
        assert kwargs.get("trust_remote_code") is False, (cls, kwargs)
        if cls == "AutoModelForImageTextToText":
            assert kwargs.get("use_safetensors") is True, kwargs


def test_a_pickle_checkpoint_is_refused(saved_qwen_pair, tmp_path, monkeypatch):
    """A model directory with only pytorch_model.bin (a pickle: it can run code when loaded) is refused
    with one line, and torch.load is never called."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from sage_engine import ModelError, load_pair

    target, _ = saved_qwen_pair
    bin_dir = tmp_path / "bin-only"
    shutil.copytree(target, bin_dir)
    torch.save(load_file(bin_dir / "model.safetensors"), bin_dir / "pytorch_model.bin")  # same weights, pickled
    for f in bin_dir.glob("*.safetensors*"):
        f.unlink()
    assert not list(bin_dir.glob("*.safetensors")) and (bin_dir / "pytorch_model.bin").is_file()
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called on a pickle"))
    with pytest.raises(ModelError) as e:
        load_pair(target=str(bin_dir), draft=None)
    assert "\n" not in str(e.value) and "cannot load model" in str(e.value), e.value
    print(f"\n{e.value}")
    assert os.path.isfile(bin_dir / "pytorch_model.bin")

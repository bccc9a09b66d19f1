import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def saved_qwen_pair(tmp_path_factory):
    """A tiny Qwen2.5-VL target/draft pair saved like a real checkpoint (safetensors + processor)."""
    from tiny_models import qwen25_pair

    pair = qwen25_pair("noisy", seed=3)
    root = tmp_path_factory.mktemp("tiny_qwen")
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        model.save_pretrained(root / name)
        pair.processor.save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")

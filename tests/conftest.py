import os
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# their helpers' asserts (check_summary, check_labels) explain a failure as a test's do
pytest.register_assert_rewrite("app_server", "browser_checks")


@pytest.fixture(scope="session", autouse=True)
def one_math_thread():
    """One torch thread for the whole session: the tiny test models gain nothing from two, and once the
    in-process app (app_server.launch) has decoded in its own threads, two-thread OpenMP regions in this thread
    run several times slower (a 64x64 matrix product: 4x; the chi-square tests: 2x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def saved_qwen_pair(tmp_path_factory):
    """A tiny Qwen2.5-VL target/draft pair saved like a real checkpoint (safetensors + processor)."""
    from sage_testing.tiny_pairs import qwen25_pair, save_pair

    return save_pair(qwen25_pair("noisy", seed=3), tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="session")
def bench_files(tmp_path_factory):
    """benchfiles.write_fixtures: a three-row file of each benchmark format, rendered from tinyworld."""
    from sage_engine.evaluation.benchfiles import write_fixtures

    return write_fixtures(tmp_path_factory.mktemp("bench_files"))


# ---------------------------------------------------------------- the launched demo (the test_app_*.py files)


@pytest.fixture(scope="session")
def server():
    import app_server

    return app_server.launch()


@pytest.fixture(scope="session")
def client(server):
    from gradio_client import Client

    return Client(server.url, verbose=False)


@pytest.fixture(scope="session")
def media(tmp_path_factory):
    import app_server

    return app_server.media(str(tmp_path_factory.mktemp("app_media")))


# ---------------------------------------------------------------- tinyworld (the test_tinyworld_*.py files)


@pytest.fixture(scope="module")
def tok():
    from sage_engine.tinyworld.tokenizer import build_tokenizer, world_corpus

    return build_tokenizer(world_corpus(200, 0))

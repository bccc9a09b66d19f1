"""`sage doctor`: the one command a GPU machine runs first, proven here on the CPU in its quick mode. Every fp32 row
exact and the exit status 0; a planted acceptance bug gives exit status 1 and the rows where runs part; the host-read
census files each read under its stage and counts only the watched device's tensors; the multi-device placement
splits the layers in order and takes the path a spread target takes."""

import json

import pytest
import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.cli import main
from sage_engine.errors import SageError
from sage_engine.evaluation.doctor import cases, machine, syncs
from sage_engine.evaluation.doctor.exactness import POLICIES, parted_at
from sage_testing.tiny_pairs import image, llava_pair, qwen25_pair, sharp_pair


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("doctor") / "doctor.json"
    status = main(["doctor", "--device", "cpu", "--quick", "--out", str(out)])
    return status, json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_quick_doctor_on_the_cpu_is_exact_and_reports_every_section(quick):
    status, report, md = quick
    assert status == 0 and report["mismatches"] == []
    assert report["machine"]["devices"][0]["device"] == "cpu" and report["machine"]["torch"] == torch.__version__
    for section in ("fp32", "multi"):
        assert report[section], section
        for case in report[section]:
            assert {r["policy"] for r in case["rows"]} >= set(POLICIES)
            assert all(r["exact"] for r in case["rows"]), case["case"]
    assert any(r["policy"] == "generate() vs ar" for r in report["fp32"][0]["rows"])  # ar is transformers' greedy
    assert all(0 <= c["pass_gap"] < 1e-4 for c in report["fp32"])  # a token alone and as a tree's root: ~1e-6
    for case in report["multi"]:  # the spread target runs through forward(), as a target over GPUs does
        assert case["backends"]["target"]["cached"] == "forward" and len(set(case["device_map"].values())) == 1
        assert any("spread by a device map" in n for n in case["backends"]["target"]["notes"])  # and says why
    assert report["bf16"] and all(0 <= c["agreement"] <= 1 for c in report["bf16"])
    speed = report["speed"]
    assert speed["ar"]["tokens_per_second"] > 0 and speed["sage"]["tau"] > 2 and speed["sage"]["exact"]
    assert set(speed["verify"]["relative"]) == {"1", "8", "32", "64"}
    assert speed["host_reads"]["ar"]["stages"]["verify"]["most"] == 1  # one read of the argmax per plain step
    for heading in ("## fp32", "## Multi-device placement", "## bf16", "## Speed", "## Host reads"):
        assert heading in md


def test_a_policy_that_parts_from_ar_fails_the_doctor(tmp_path, monkeypatch, capsys):
    from sage_engine.core.verify import GreedyAcceptance, Verdict

    real = GreedyAcceptance.__call__

    def wrong(self, tree, verify):  # a planted bug: after a drafted tree, the bonus token is off by one
        v = real(self, tree, verify)
        return Verdict(v.accepted, v.accepted_tokens, v.bonus + 1, v.trials) if tree.tokens else v

    monkeypatch.setattr(GreedyAcceptance, "__call__", wrong)
    import sage_engine.evaluation.doctor as doctor

    one = cases.Case("tiny Qwen2.5-VL (image, noisy draft)", cases._tiny("qwen2.5-vl", "image", "noisy"), 12)
    monkeypatch.setattr(doctor, "checked_cases", lambda quick: [one])
    monkeypatch.setattr(doctor, "measure", lambda *a, **k: _speed_stub())
    assert main(["doctor", "--device", "cpu", "--quick", "--out", str(tmp_path / "d.json")]) == 1
    report = json.loads((tmp_path / "d.json").read_text())
    assert any("chain parts at" in m for m in report["mismatches"])
    assert "fp32 MISMATCH" in capsys.readouterr().out


def _speed_stub() -> dict:
    """What the summary reads of the speed section (the planted-bug test skips the measurement)."""
    row = {"tokens_per_second": 1.0, "tau": 1.0, "target_ms_per_step": 1.0, "draft_ms_per_step": 0.0,
           "engine_ms_per_step": 0.1}
    census = {"stages": {}, "sites": [], "synchronize": 0, "decode_steps": 0, "stages_over_one": []}
    return {"target": "stub", "target_params_m": 0, "draft_params_m": 0, "dtype": "float32", "new_tokens": 0,
            "ar": row, "sage": {**row, "exact": True}, "speedup": 1.0,
            "verify": {"one_token_ms": 1.0, "relative": {"1": 1.0}},
            "host_reads": {"ar": census, "sage": census}}


def test_the_census_files_reads_under_their_stage():
    pair = sharp_pair("qwen2.5-vl", "noisy")
    engine = SpecEngine(pair, tree_forward="layers")
    prep = prepare_input(pair, "describe what you see", images=[image(10)])
    with syncs.watch("cpu") as census:
        res = engine.generate(prep, "chain", max_new_tokens=16, ignore_eos=True)
    summary = census.summary()
    steps = sum(s.kind == "decode" for s in res.steps)
    assert summary["decode_steps"] == steps
    assert summary["stages"]["verify"] == {"steps": steps, "mean": 1.0, "most": 1}  # the rows' argmax, once a step
    assert summary["stages"]["draft"]["most"] >= 2  # a chain reads its draft's choice at every level
    assert summary["stages"]["prefill"]["steps"] >= 1
    assert {s["stage"] for s in summary["sites"]} <= {"prefill", "draft", "verify", "accept", "compact", "observe",
                                                     "emit"}
    assert summary["stages_over_one"] == ["draft"] and summary["synchronize"] == 0


def test_the_census_counts_only_the_watched_devices_reads():
    """The census's device filter and its reading of `.cpu()` / `.to(...)` as host copies, on the meta device: the
    logic a GPU run takes, with another device than the CPU."""
    meta, host = torch.empty(3, device="meta"), torch.zeros(3)
    with syncs.watch("meta") as census:
        host.tolist()  # the CPU's tensors: not the watched device
        meta.to(torch.float16)  # stays on the device: no read
        for move in (lambda: meta.cpu(), lambda: meta.to("cpu"), lambda: meta.tolist()):
            with pytest.raises((NotImplementedError, RuntimeError)):  # meta tensors hold no values to copy
                move()
    assert sum(census.by_step.values()) == 3
    assert {op for (_, _, op) in census.by_site} == {"cpu", "to", "tolist"}


@pytest.mark.parametrize("build", [qwen25_pair, llava_pair])
def test_layer_map_splits_the_decoder_layers_in_order(build):
    target = build("noisy").target
    names = [n for n, _ in target.named_parameters()]
    for shards in (2, 3):
        plan = cases.layer_map(target, shards)
        owner = {n: next(plan[k] for k in plan if n == k or n.startswith(k + ".")) for n in names}
        layers = [v for k, v in plan.items() if ".layers." in k]
        assert layers == sorted(layers) and set(layers) == set(range(min(shards, len(layers))))
        assert owner[next(n for n in names if "embed_tokens" in n)] == 0
        assert owner[next(n for n in names if n.startswith("lm_head"))] == shards - 1


def test_parted_at():
    assert parted_at([1, 2, 3], [1, 2, 3]) is None
    assert parted_at([1, 5, 3], [1, 2, 3]) == 1
    assert parted_at([1, 2], [1, 2, 3]) == 2


def test_pins_differences_are_warnings_not_errors(monkeypatch):
    monkeypatch.setattr(machine, "pins", lambda: {"torch": "0.0.1", "numpy": __import__("numpy").__version__})
    pkgs, warnings = machine.packages()
    assert pkgs["torch"]["pinned"] == "0.0.1" and any(w.startswith("torch ") for w in warnings)
    assert not any(w.startswith("numpy ") for w in warnings)


def test_exact_fp32_turns_tf32_off_and_restores_it():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with machine.exact_fp32():
            assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_a_gpu_device_without_cuda_is_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["doctor", "--device", "cuda", "--out", "/tmp/never.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --device cuda needs a GPU")


def test_the_gpu_branches_of_the_machine_report_and_the_sync_cross_check(monkeypatch, quick):
    """What the doctor does only on a GPU, driven on the CPU with torch.cuda's answers faked: the device list of
    `multi` and `cuda:N`, each GPU's description, and torch's sync debug mode counted by its warnings."""
    import types
    import warnings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(
        name="Fake GPU", total_memory=80 * 2**30, major=9, minor=0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90000)
    assert machine.devices("multi") == ["cuda:0", "cuda:1", "cuda:2"] and machine.devices("cuda:2") == ["cuda:2"]
    assert machine.devices("cuda") == ["cuda:0"]
    with pytest.raises(SageError, match="sees 3 GPU"):
        machine.devices("cuda:5")
    found = machine.describe(["cuda:0", "cuda:1"])["devices"]
    assert found[1] == {"device": "cuda:1", "name": "Fake GPU", "memory_gib": 80.0, "capability": "9.0", "bf16": True,
                        "fp16": True}
    from sage_engine.evaluation.doctor.summary import markdown

    report = quick[1]
    assert "cuda:1 (Fake GPU, 80.0 GiB, compute capability 9.0; bf16 yes, fp16 yes)" in markdown(
        {**report, "machine": {**report["machine"], "devices": found}})
    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    with syncs.cuda_sync_warnings() as seen:
        warnings.warn("called a synchronizing CUDA operation\nmore", stacklevel=1)
        warnings.warn("something else", stacklevel=1)
    assert seen == ["called a synchronizing CUDA operation"] and modes == ["warn", 0]


def test_the_multi_layout_spreads_the_target_and_gives_the_draft_its_own_device():
    from sage_engine.evaluation.doctor import multi_layout

    gpus = [f"cuda:{i}" for i in range(4)]
    assert multi_layout(gpus) == (gpus[:3], "cuda:3")
    assert multi_layout(gpus[:2]) == (gpus[:2], "cuda:1")
    assert multi_layout(["cpu"]) == (["cpu", "cpu"], "cpu")

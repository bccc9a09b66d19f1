"""Command line: `python -m sage_engine generate ...`, `bench ...`, `check-sampling ...` and `doctor ...`.

Error contract: anything the user can fix (bad file, unknown policy, too long a prompt,
unloadable model) exits with status 2 and ONE line on stderr starting with `error:`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from .core.events import summarize
from .errors import SageError, first_line
from .policies import POLICY_NAMES
from .run_flags import load_from_flags, load_policy_modules, model_args, pair_names, policy_module_arg


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); > 0: sample")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the top-p nucleus (with --temperature)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (with --temperature)")


def _sampling(args):
    """Sampling settings from the flags, checked before any model loads (SageError: one line)."""
    from .core.sampling import Sampling

    try:
        return Sampling(args.temperature, args.top_p, args.seed)
    except ValueError as e:
        raise SageError(str(e)) from None


def _check_policy(spec: str) -> None:
    """A policy name, or a spec with knobs as bench takes them, checked before anything loads (SageError)."""
    from .policies import make_policy

    try:
        make_policy(spec)
    except ValueError as e:
        raise SageError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m sage_engine", description="SAGE speculative decoding for VLMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="decode one prompt (with images or a video; a text-only pair: text alone)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    gen.add_argument("--video", default=None, help="video file (frames sampled uniformly)")
    gen.add_argument("--frames", type=int, default=None, help="video frames to sample (default: the model's)")
    gen.add_argument("--policy", default="sage",
                     help=f"one of {', '.join(POLICY_NAMES)} or a registered one (--policy-module); a policy may "
                          "change knobs, e.g. sage:d_max=8; priced:NAME prices it by this machine")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, ids, stats, steps")
    gen.add_argument("--num-samples", type=int, default=1,
                     help="samples with seeds --seed, --seed + 1, ... (with --temperature); --json: one line each")
    gen.add_argument("--warmup", type=int, default=0,
                     help="decode the input this many times first, untimed and not shown: a fresh process's first "
                          "run is slower (~5-10%% on the embedded pair), and the engine's cost meter starts empty")
    model_args(gen)
    _sampling_args(gen)
    policy_module_arg(gen)

    bench = sub.add_parser("bench", help="every policy on every image/video of a folder")
    bench.add_argument("--inputs", required=True, help="folder of images/videos (prompts.jsonl optional)")
    bench.add_argument("--prompt", default=None, help="prompt for inputs without their own")
    bench.add_argument("--policies", default=",".join(POLICY_NAMES),
                       help="comma-separated policies; a policy may change knobs, e.g. sage:n_max=32:d_max=10; "
                            "outside references: hf_generate, hf_assisted[:schedule=constant|heuristic]")
    bench.add_argument("--limit", type=int, default=None, help="use only the first N inputs")
    bench.add_argument("--warmup", type=int, default=1, help="inputs decoded once before timing")
    bench.add_argument("--rounds", type=int, default=1,
                       help="decode every input with every policy this many times; keep each one's median-time run")
    bench.add_argument("--out", required=True, help="report JSON file")
    model_args(bench)
    _sampling_args(bench)
    policy_module_arg(bench)

    check = sub.add_parser("check-sampling", help="is a policy's sampling lossless? the first two tokens' "
                                                  "distribution against the target's exact one (chi-square)")
    check.add_argument("--policy", default="sage", help="a policy name or spec, as generate takes it")
    check.add_argument("--samples", type=int, default=400, help="draws (seeds --seed, --seed + 1, ...)")
    check.add_argument("--prompt", default="Describe the image in detail.")
    check.add_argument("--image", default=None, help="default: the first image example (assets/examples); none "
                                                     "for a text-only pair")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    model_args(check)
    _sampling_args(check)
    policy_module_arg(check)
    check.set_defaults(temperature=1.0)

    doctor = sub.add_parser("doctor", help="prove the engine on this machine's device: exactness in fp32 and bf16, "
                                           "the multi-device placement, speed on a large random target")
    doctor.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | multi (every visible GPU)")
    doctor.add_argument("--out", default="doctor.json", help="JSON report; a Markdown summary is written beside it")
    doctor.add_argument("--quick", action="store_true", help="two pairs and a smaller speed target (the test's mode)")
    doctor.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    doctor.add_argument("--readme", default=None, help="also write the summary's first table into this README's "
                                                       "doctor block (the project's README shows a CPU run)")
    policy_module_arg(doctor)
    from .evaluation.experiments.cli import add_parser as add_experiment

    add_experiment(sub)
    return parser


def cmd_generate(args) -> int:
    from .core.engine import SpecEngine
    from .core.sampling import Sampling
    from .models.inputs import prepare_input
    from .models.media import load_image
    from .policies import make_policy

    _check_policy(args.policy)
    sampling = _sampling(args)
    if args.num_samples < 1 or (args.num_samples > 1 and sampling.greedy):
        raise SageError(f"--num-samples must be at least 1, and above 1 only with --temperature > 0 "
                        f"(got {args.num_samples})")
    if args.warmup < 0:
        raise SageError(f"--warmup must be at least 0 (got {args.warmup})")
    images = [load_image(p) for p in args.image]  # bad files fail before the models load
    pair = load_from_flags(args)
    prepared = prepare_input(pair, args.prompt, images=images, video=args.video, num_frames=args.frames)
    engine = SpecEngine(pair, draft_pruning=args.draft_prune, tree_forward=args.tree_forward,
                        keep_prompt=args.num_samples > 1)  # the samples share one prefilled prompt
    for _ in range(args.warmup):  # the same decode, its result dropped: what follows runs on a warm process
        engine.generate(prepared, make_policy(args.policy), args.max_new_tokens, tuple(args.stop),
                        sampling=Sampling(sampling.temperature, sampling.top_p, args.seed))
    for seed in range(args.seed, args.seed + args.num_samples):  # one loaded pair, one sample per seed
        sample = Sampling(sampling.temperature, sampling.top_p, seed)
        policy = make_policy(args.policy)  # a fresh policy per sample: its adaptive state is per run
        if args.json:
            res = engine.generate(prepared, policy, args.max_new_tokens, tuple(args.stop), sampling=sample)
            print(json.dumps({**res.to_dict(), "backends": engine.backends(),
                              **({} if sampling.greedy else {"seed": seed})}), flush=True)
        else:
            _stream_text(engine.stream(prepared, policy, args.max_new_tokens, tuple(args.stop), sampling=sample),
                         f"{args.policy}" + ("" if sampling.greedy else f", seed {seed}"))
    return 0


def _stream_text(events, label: str) -> None:
    """Print a run's text as it streams, then its figures on stderr."""
    steps, t0 = [], time.perf_counter()
    for ev in events:
        steps.append(ev)
        print(ev.new_text, end="", flush=True)
    ids = [t for s in steps for t in s.new_token_ids]
    st = summarize(steps, ids, time.perf_counter() - t0)
    print(f"\n[{label}] {st.new_tokens} tokens, {st.tokens_per_second:.1f} tok/s, "
          f"tau {st.mean_accepted:.2f}, {st.target_forwards} target forwards", file=sys.stderr)


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from .evaluation.bench import check_rounds, check_spec, find_inputs, format_table, needs_draft, run_bench
    from .evaluation.hf_reference import is_hf_spec

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:  # a name, or a spec with knobs: sage:n_max=32:d_max=10, hf_assisted:schedule=heuristic
        try:
            check_spec(p)
        except ValueError as e:
            raise SageError(str(e)) from None
    sampling = _sampling(args)
    if not sampling.greedy and (hf := [p for p in policies if is_hf_spec(p)]):
        raise SageError(f"{hf[0]!r} runs greedy only; drop it or --temperature")
    if pair_names(args)[1] is None and (drafting := [p for p in policies if needs_draft(p)]):
        raise SageError(f"policy {drafting[0]!r} needs a draft model; this run has none (--draft {args.draft!r})")
    check_rounds(args.rounds)
    inputs = find_inputs(args.inputs, args.prompt)[: args.limit]
    pair = load_from_flags(args)
    n_pol = len(set(policies) | {"ar"})
    with tqdm(total=len(inputs) * n_pol * args.rounds, desc="bench", unit="run", file=sys.stderr) as bar:
        report = run_bench(pair, inputs, policies, args.max_new_tokens, args.warmup, bar, args.draft_prune,
                           tree_forward=args.tree_forward, sampling=sampling, rounds=args.rounds)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(format_table(report))
    print(f"report: {args.out}")
    return 0


def cmd_check_sampling(args) -> int:
    """Exit 0 when the p-value is at least 0.001, 1 below it (the policy's sampling is not the target's)."""
    from .core.engine import SpecEngine
    from .evaluation.sampling_check import POWER, check_sampling
    from .models.families import is_tokenizer
    from .models.inputs import prepare_input
    from .models.media import load_image
    from .models.presets import ASSETS

    _check_policy(args.policy)
    sampling = _sampling(args)
    if sampling.greedy:
        raise SageError("check-sampling needs --temperature > 0 (greedy decoding is checked by the test suite)")
    if args.samples < 1:
        raise SageError(f"--samples must be at least 1 (got {args.samples})")
    image = load_image(args.image or str(ASSETS / "examples" / "shapes_1.png"))
    pair = load_from_flags(args)
    engine = SpecEngine(pair, tree_forward=args.tree_forward)
    images = [] if args.image is None and is_tokenizer(pair.processor) else [image]  # a text-only pair: the prompt
    result = check_sampling(engine, prepare_input(pair, args.prompt, images=images), args.policy, sampling,
                            args.samples)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"{result.policy}: chi2 {result.chi2:.1f} (dof {result.dof}), p {result.p_value:.3g}, "
              f"TV {result.tv:.3f} over {result.samples} samples (catches a bias of {result.detectable_bias:.1%} "
              f"or more with {POWER:.0%} power)")
    return 0 if result.p_value >= 0.001 else 1


def cmd_doctor(args) -> int:
    """Exit 0 when every fp32 run wrote exactly `ar`'s tokens, 1 otherwise (evaluation/doctor/__init__.py)."""
    import torch
    from transformers.utils import logging as hf_logging

    from .evaluation.doctor import run, write

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    from .evaluation.doctor import exactness
    from .policies import MODULE_POLICIES

    exactness.add_policies(MODULE_POLICIES)  # a --policy-module's policies are checked against `ar` too
    report = run(args.device, args.quick, log=lambda line: print(line, file=sys.stderr, flush=True))
    report["command"] = "python -m sage_engine " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["doctor"] else None
    path, md = write(report, args.out)
    if args.readme:
        from pathlib import Path

        from .evaluation.doctor.summary import with_readme_table

        readme = Path(args.readme)
        readme.write_text(with_readme_table(readme.read_text(), report))
    print(md.read_text())
    print(f"report: {path}, summary: {md}")
    return 1 if report["mismatches"] else 0


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the CLI prints it: `warning: ...` on one line, without the source line Python adds."""
    return f"warning: {first_line(message) if isinstance(message, BaseException) else str(message).splitlines()[0]}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    python_format, warnings.formatwarning = warnings.formatwarning, _one_line_warning  # for this command only
    try:
        try:
            load_policy_modules(args)
        except ValueError as e:
            raise SageError(str(e)) from None
        from .evaluation.experiments.cli import cmd_experiment

        commands = {"generate": cmd_generate, "bench": cmd_bench, "check-sampling": cmd_check_sampling,
                    "doctor": cmd_doctor, "experiment": lambda a: cmd_experiment(a, argv)}
        return commands[args.command](args)
    except SageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = python_format

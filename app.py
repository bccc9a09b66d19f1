"""Serve the SAGE demo: `python app.py [--host H] [--port P] [--presets A,B] [--preset A] [--cache-examples lazy|off]`.

Host and port default to Gradio's own environment variables (GRADIO_SERVER_NAME,
GRADIO_SERVER_PORT; Hugging Face Spaces sets them), then to 127.0.0.1:7860. The model pairs
are named presets of sage_engine/models/presets.py: --presets (SAGE_PRESETS) lists those the UI may
offer (default: the embedded tinyworld pair), --preset (SAGE_PRESET) the one loaded first.
--cache-examples (SAGE_CACHE_EXAMPLES, default lazy): an example's first click races it and stores the result
in Gradio's cache dir (GRADIO_EXAMPLES_CACHE, default .gradio/cached_examples); later clicks show it, labelled
as cached. `off`: a click only fills the inputs.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Callable

if os.environ.get("SPACES_ZERO_GPU"):  # a ZeroGPU Space: `spaces` goes first, before torch (see app/gpu.py)
    import spaces  # noqa: F401

from app import SERVED, build_demo, launch_options, served  # noqa: E402
from app.device import default_threads  # noqa: E402
from app.examples import CACHE_MODES  # noqa: E402
from app.gpu import zero_gpu  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SAGE speculative decoding demo (Gradio)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME"),
                   help="interface to bind (env GRADIO_SERVER_NAME; default 127.0.0.1, use 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 0)) or None,
                   help="port (env GRADIO_SERVER_PORT; default 7860)")
    p.add_argument("--presets", default=os.environ.get("SAGE_PRESETS", ",".join(SERVED)),
                   help="comma-separated model presets the UI may offer (env SAGE_PRESETS; default %(default)s)")
    p.add_argument("--preset", default=os.environ.get("SAGE_PRESET"),
                   help="the preset loaded first and selected (env SAGE_PRESET; default: the first of --presets)")
    p.add_argument("--max-file-size", default=os.environ.get("SAGE_MAX_FILE_SIZE", "64mb"),
                   help="upload size cap, e.g. 64mb (env SAGE_MAX_FILE_SIZE)")
    p.add_argument("--no-preload", action="store_true",
                   help="load the model pair on the first run (default: in the background while the page is served)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("SAGE_THREADS", 0)) or default_threads(),
                   help="torch CPU threads (env SAGE_THREADS; default: one per core but one, which the web "
                        "server keeps; README, 'The demo's speed')")
    p.add_argument("--cache-examples", choices=CACHE_MODES, default=os.environ.get("SAGE_CACHE_EXAMPLES", "lazy"),
                   help="lazy: an example's first click races it and stores the result, later clicks show it "
                        "(labelled as cached); off: a click only fills the inputs (env SAGE_CACHE_EXAMPLES; "
                        "default %(default)s)")
    p.add_argument("--policy-module", action="append", default=[], metavar="FILE",
                   help="a Python file that registers policies with sage_engine.register_policy (repeatable), loaded "
                        "before the app is built: the policy dropdown and the API offer them after the engine's own")
    return p.parse_args(argv)


SERVED_WAIT_S = 60.0  # the longest the engine's imports wait for the page (a server that never comes up)


def engine_setup(threads: int, served_page: threading.Event) -> Callable[[], None]:
    """The process-wide engine settings, as a function that the pair pool queues on its device thread before any pair
    loads (app/pool.py): torch's CPU threads, and on a first start Numba's compile moved to a background process. They
    import torch, Numba and then the rest of the engine (transformers), which take seconds: done there, behind the
    page, the page does not wait for them, and the pair's load time in the log is the load's alone. They start once
    `served_page` is set: run beside Gradio's own start, they would slow it (one GIL between the two threads)."""

    def setup() -> None:
        log = logging.getLogger("sage.app")
        served_page.wait(SERVED_WAIT_S)
        t0 = time.perf_counter()
        if threads:
            import torch

            torch.set_num_threads(threads)
        from sage_engine.core import jit

        if jit.defer_compile():  # a first start: Numba compiles in the background, the first runs take plain Python
            log.info("compiling the engine's Numba code in the background")
        import sage_engine.core.engine  # noqa: F401 - the engine's remaining imports, timed here rather than in the load

        log.info("imported torch and the engine in %.1f s", time.perf_counter() - t0)

    return setup


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        registered = []
        if args.policy_module:
            from sage_engine.policies import load_policy_module

            for path in args.policy_module:
                registered += load_policy_module(path)
        presets = served(args.presets.split(","))
        # ZeroGPU: the pair must be on cuda before launch (a lazy load would happen in the GPU worker); elsewhere the
        # page is served at once and the pair loads behind it
        preload = "now" if zero_gpu() else "off" if args.no_preload else "background"
        served_page = threading.Event()
        if preload == "now":  # the load, and so the engine's setup before it, runs before launch: it cannot wait
            served_page.set()
        demo = build_demo(presets, default_preset=args.preset, preload=preload, cache_examples=args.cache_examples,
                          setup=engine_setup(args.threads, served_page), policies=tuple(registered))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    logging.getLogger("sage.app").info("app built in %.1f s", time.perf_counter() - t0)
    try:  # launch() returns once the server answers; block_thread() then serves until interrupted, as launch() would
        demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True,
                    **launch_options(args.max_file_size))
    finally:
        served_page.set()  # also on a failed launch: the device thread must not sit out SERVED_WAIT_S at exit
    demo.block_thread()


if __name__ == "__main__":
    main()

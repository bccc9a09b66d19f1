"""Serve the SAGE demo: `python app.py [--host H] [--port P] [--presets A,B] [--preset A] [--cache-examples lazy|off]`.

Host and port default to Gradio's own environment variables (GRADIO_SERVER_NAME,
GRADIO_SERVER_PORT; Hugging Face Spaces sets them), then to 127.0.0.1:7860. The model pairs
are named presets of sage_engine/presets.py: --presets (SAGE_PRESETS) lists those the UI may
offer (default: the embedded tinyworld pair), --preset (SAGE_PRESET) the one loaded first.
--cache-examples (SAGE_CACHE_EXAMPLES, default lazy): an example's first click races it and stores the result
in Gradio's cache dir (GRADIO_EXAMPLES_CACHE, default .gradio/cached_examples); later clicks show it, labelled
as cached. `off`: a click only fills the inputs.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

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
    return p.parse_args(argv)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from sage_engine import jit

    if jit.defer_compile():  # a first start: Numba compiles in the background, the first runs take plain Python
        logging.getLogger("sage.app").info("compiling the engine's Numba code in the background")
    try:
        presets = served(args.presets.split(","))
        # ZeroGPU: the pair must be on cuda before launch (a lazy load would happen in the GPU worker); elsewhere the
        # page is served at once and the pair loads behind it
        preload = "now" if zero_gpu() else "off" if args.no_preload else "background"
        demo = build_demo(presets, default_preset=args.preset, preload=preload, cache_examples=args.cache_examples)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    logging.getLogger("sage.app").info("app built in %.1f s", time.perf_counter() - t0)
    demo.launch(server_name=args.host, server_port=args.port, **launch_options(args.max_file_size))


if __name__ == "__main__":
    main()

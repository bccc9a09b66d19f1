"""Serve the SAGE demo: `python app.py [--host H] [--port P] [--preset NAME]`.

Host and port default to Gradio's own environment variables (GRADIO_SERVER_NAME,
GRADIO_SERVER_PORT; Hugging Face Spaces sets them), then to 127.0.0.1:7860. The model pair
is one of the configured presets (app/presets.py), chosen by --preset or SAGE_PRESET.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from app import DEFAULT_PRESET, PRESETS, build_demo, launch_options


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SAGE speculative decoding demo (Gradio)")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME"),
                   help="interface to bind (env GRADIO_SERVER_NAME; default 127.0.0.1, use 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 0)) or None,
                   help="port (env GRADIO_SERVER_PORT; default 7860)")
    p.add_argument("--preset", default=os.environ.get("SAGE_PRESET", DEFAULT_PRESET), choices=list(PRESETS),
                   help="model pair to serve first (env SAGE_PRESET)")
    p.add_argument("--max-file-size", default=os.environ.get("SAGE_MAX_FILE_SIZE", "64mb"),
                   help="upload size cap, e.g. 64mb (env SAGE_MAX_FILE_SIZE)")
    p.add_argument("--no-preload", action="store_true", help="load the model pair on the first run instead")
    return p.parse_args(argv)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    demo = build_demo(default_preset=args.preset, preload=not args.no_preload)
    logging.getLogger("sage.app").info("app built in %.1f s", time.perf_counter() - t0)
    demo.launch(server_name=args.host, server_port=args.port, **launch_options(args.max_file_size))


if __name__ == "__main__":
    main()

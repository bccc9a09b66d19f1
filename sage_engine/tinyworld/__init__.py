"""tinyworld: the synthetic world of the embedded VLM pair, and what the pair needs at run time.

world.py (scenes, clips, rendering, video files), language.py (questions, answers, scorers), tokenizer.py,
architecture.py (the pair's configs and processor), render.py (benchmark scenes, demo inputs) and evaluate.py
(accuracy on fresh scenes). Training lives in training/; `python -m sage_engine.tinyworld` is the command line.
"""

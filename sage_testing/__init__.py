"""Tiny random model pairs built in code, for the tests and `sage doctor`: `tiny_pairs.py` (Qwen2.5-VL, LLaVA, a
Llama text pair, media written to disk) and `tiny_kinds.py` (current architectures' layer kinds). Outside
`sage_engine`: the engine and the app never import it.
"""

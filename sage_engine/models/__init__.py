"""The model side: families and their adapters, layer kinds and the checks that a model's trees are exact, inputs and
media, loading, placement and named pairs, and the draft's visual-token pruning.

Nothing is imported here: `sage_engine.models.media` and `sage_engine.models.presets` stay importable without torch
(the demo's page needs them).
"""

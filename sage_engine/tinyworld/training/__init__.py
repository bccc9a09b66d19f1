"""How the tinyworld pair is trained; nothing here runs at inference or evaluation time.

- config.py: TrainConfig, the recipe (its defaults train the shipped pair)
- data.py: renders the seeded training scenes once into a cache directory (pictures, tokens, per-token targets)
- trainset.py: batches from that cache (kind / confusable-example weighting, left-right mirroring)
- vision_aux.py: training-only heads on the visual tokens (VisionAux on the tower, PlaceAux in the language model)
- retrieval.py: which visual tokens each answer / question token is about, and the attention loss built on it
- losses.py: the learning-rate schedule, the weighted answer loss and the running averages the loops log
- train.py: the training loops (vision stage, target, draft distillation) and summary.json
- card.py, timing.py: the model cards of a shipped pair
- commands.py: the `train`, `ship` and `card` commands of `python -m sage_engine.tinyworld`
"""

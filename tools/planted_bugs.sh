#!/usr/bin/env bash
# One-off audit: plant each bug the engine-house issue names, run the tests that must catch it, undo it.
# Each line prints CAUGHT (the tests failed) or MISSED. Run from the repository root on a clean work tree.
set -u
plant() {  # name, file, python expression replacing text in the file, tests
  local name=$1 file=$2 old=$3 new=$4; shift 4
  cp "$file" /tmp/planted.bak
  if ! python - "$file" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if old not in text:
    sys.exit(f"the code to plant the bug in is not in {path} any more: update this script")
open(path, "w").write(text.replace(old, new, 1))
PY
  then echo "NOT PLANTED  $name"; return; fi
  if python -m pytest -q -x -p no:randomly "$@" >/tmp/planted.log 2>&1; then echo "MISSED  $name"; else echo "CAUGHT  $name ($(grep -m1 -oE '^FAILED [^ ]+' /tmp/planted.log))"; fi
  cp /tmp/planted.bak "$file"
}
plant "a wrong width decay in the one rule" sage_engine/rules.py \
  "math.ceil(width / level * (bias" "math.ceil(width / (level + 1) * (bias" tests/test_rules.py tests/test_shipped_pair.py
plant "the shipped pair knocked off its fast backend (RMSNorm eps x1000)" sage_engine/backends/fused_products.py \
  "floor = torch.tensor((d * eps) ** 0.5" "floor = torch.tensor((d * eps * 1000) ** 0.5" tests/test_shipped_pair.py
plant "a cost rule that never drafts" sage_engine/policies/fallback.py \
  "if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= plain:" "if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= 100 * plain:" tests/test_shipped_pair.py
plant "a subclass override ignored" sage_engine/policies/sage.py \
  "changed = overridden(self, SagePolicy, _SHAPE_HOOKS)" "changed = []" tests/test_shipped_pair.py
plant "a verify mask that hides a grandparent (default builder)" sage_engine/rules.py \
  "            allowed[i + 1, a + 1] = True
            a = parents[a]" "            allowed[i + 1, a + 1] = True
            a = parents[a] if a == i else -1" tests/test_rules.py
plant "a ratio test 10% too lenient (accept when u*q < 1.1 p)" sage_engine/sampling.py \
  "return u * q_x < p_x, u" "return u * q_x < 1.1 * p_x, u" \
  "tests/test_sampling.py::test_the_first_two_tokens_follow_the_targets_distribution_for_every_policy"
plant "a rejection that redraws from p, not from the residual max(0, p - q)" sage_engine/sampling.py \
  "residual = np.maximum(p - q, 0.0)" "residual = p.copy()" \
  "tests/test_sampling.py::test_the_first_two_tokens_follow_the_targets_distribution_for_every_policy"
plant "a price model that forgets what a verified node costs" sage_engine/experiments/prices.py \
  "return self.base + self.node * nodes" "return self.base" \
  "tests/test_experiments.py::test_the_cost_model_reproduces_this_machine_and_labels_what_it_models"
plant "PaliGemma's positions counted from 0" sage_engine/families.py \
  "Positions1D(start=1)" "Positions1D(start=0)" \
  "tests/test_decode_check.py::test_paligemma_reads_its_prompt_as_the_model_does"
plant "Llama 3.2 Vision's cross-attention mask left off the decode passes" sage_engine/families.py \
  'carried=("cross_attention_mask",))' "carried=())" \
  "tests/test_layer_kinds.py::test_every_policy_equals_ar_past_the_window[mllama-image]"
plant "a cross-attention cache (the image's keys) compacted like text columns" sage_engine/cache.py \
  "layers = cache.layers if not whole else" "layers = cache.layers if True else" \
  "tests/test_layer_kinds.py::test_every_policy_equals_ar_past_the_window[mllama-image]"
plant "a model with its own cache_params let through (its ar ignores the state)" sage_engine/ar_check.py \
  'if "past_key_values" in params:' "if True:" \
  "tests/test_decode_check.py::test_a_model_with_its_own_cache_is_refused_whole"

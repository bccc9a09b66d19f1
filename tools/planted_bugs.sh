#!/usr/bin/env bash
# One-off audit: plant each bug the engine-house issue (and issue 82) names, run the tests that must catch it, undo it.
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
plant "a wrong width decay in the one rule" sage_engine/core/rules.py \
  "math.ceil(width / level * (bias" "math.ceil(width / (level + 1) * (bias" tests/test_rules.py tests/test_shipped_pair.py
plant "the shipped pair knocked off its fast backend (RMSNorm eps x1000)" sage_engine/backends/fused_products.py \
  "floor = torch.tensor((d * eps) ** 0.5" "floor = torch.tensor((d * eps * 1000) ** 0.5" tests/test_shipped_pair.py
plant "a cost rule that never drafts" sage_engine/policies/fallback.py \
  "if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= plain:" "if (robust_rate(recent, self.cfg.fallback_z) or 0.0) >= 100 * plain:" tests/test_shipped_pair.py
plant "a subclass override ignored" sage_engine/policies/sage.py \
  "changed = overridden(self, SagePolicy, _SHAPE_HOOKS)" "changed = []" tests/test_shipped_pair.py
plant "a verify mask that hides a grandparent (default builder)" sage_engine/core/rules.py \
  "            allowed[i + 1, a + 1] = True
            a = parents[a]" "            allowed[i + 1, a + 1] = True
            a = parents[a] if a == i else -1" tests/test_rules.py
plant "a ratio test 10% too lenient (accept when u*q < 1.1 p)" sage_engine/core/sampling.py \
  "return u * q_x < p_x, u" "return u * q_x < 1.1 * p_x, u" \
  "tests/test_sampling.py::test_the_first_two_tokens_follow_the_targets_distribution_for_every_policy"
plant "a rejection that redraws from p, not from the residual max(0, p - q)" sage_engine/core/sampling.py \
  "residual = np.maximum(p - q, 0.0)" "residual = p.copy()" \
  "tests/test_sampling.py::test_the_first_two_tokens_follow_the_targets_distribution_for_every_policy"
plant "a price model that forgets what a verified node costs" sage_engine/evaluation/experiments/prices.py \
  "return self.base + self.node * nodes" "return self.base" \
  "tests/test_experiments.py::test_the_cost_model_reproduces_this_machine_and_labels_what_it_models"
plant "PaliGemma's positions counted from 0" sage_engine/models/families.py \
  "Positions1D(start=1)" "Positions1D(start=0)" \
  "tests/test_decode_check.py::test_paligemma_reads_its_prompt_as_the_model_does"
plant "Llama 3.2 Vision's cross-attention mask left off the decode passes" sage_engine/models/families.py \
  'carried=("cross_attention_mask",))' "carried=())" \
  "tests/test_layer_kinds.py::test_every_policy_equals_ar_past_the_window[mllama-image]"
plant "a cross-attention cache (the image's keys) compacted like text columns" sage_engine/core/cache.py \
  "layers = cache.layers if not whole else" "layers = cache.layers if True else" \
  "tests/test_layer_kinds.py::test_every_policy_equals_ar_past_the_window[mllama-image]"
plant "a model with its own cache_params let through (its ar ignores the state)" sage_engine/models/ar_check.py \
  'if "past_key_values" in params:' "if True:" \
  "tests/test_decode_check.py::test_a_model_with_its_own_cache_is_refused_whole"
REF="tests/test_reference.py::test_the_reference_loop_draws_the_engines_trees_and_tokens[qwen2.5-vl-image]"
plant "the fused target's KV compaction keeps the region as it was (no gather)" sage_engine/core/cache.py \
  "a[:, :, start : start + keep.shape[0]] = a[:, :, keep + start]" "a[:, :, start : start + keep.shape[0]] = a[:, :, start : start + keep.shape[0]]" \
  tests/test_cache.py
plant "a layer-by-layer KV compaction that forgets to move the keys" sage_engine/core/cache.py \
  "            layer.keys[:, :, start : start + m] = layer.keys[:, :, idx]  # gather copies first: overlap-safe" "            pass" \
  "$REF"
plant "the greedy bonus token taken after the root, not after the accepted path" sage_engine/core/tree.py \
  "            node, want = i, target_next[1 + i]
    return path, want" "            node, want = i, target_next[1 + i]
    return path, target_next[0]" tests/test_tree.py "$REF"
plant "an end-of-sequence token cut from the output" sage_engine/core/transcript.py \
  "take = take[: next(i for i, tok in enumerate(take) if tok in self.eos) + 1]" "take = take[: next(i for i, tok in enumerate(take) if tok in self.eos)]" \
  tests/test_equivalence.py::test_eos_inside_an_accepted_chunk_stops_at_the_same_token
plant "a step drafting deeper than the tokens its budget leaves" sage_engine/core/engine.py \
  "left = out.budget - len(out.ids)  # tokens" "left = out.budget - len(out.ids) + 2  # tokens" \
  tests/test_engine.py::test_sage_reports_its_tree_shape_and_controller tests/test_equivalence.py::test_budget_cuts_inside_a_step
plant "a kept prompt's cache handed over, not copied (keep_prompt)" sage_engine/core/runner.py \
  "self.cache, self.rope_delta = copy_cache(kept.cache), kept.rope_delta" "self.cache, self.rope_delta = kept.cache, kept.rope_delta" \
  tests/test_engine.py::test_kept_prompt_gives_the_same_runs_without_running_the_prefill_again
plant "the tree rule drawing every node's token from the root's distribution" sage_engine/core/sampling.py \
  "            p = ps[0 if node < 0 else 1 + node]" "            p = ps[0]" \
  tests/test_sampling.py::test_every_tree_rule_policy_samples_what_the_target_alone_samples_with_the_same_seed
plant "the compiled step's theta_l halved (compiled and Python trees diverge)" sage_engine/backends/draft_compiled.py \
  "rule.level.bias, rule.level.theta_scale, *price_numbers(rule.price)" "rule.level.bias, 0.5 * rule.level.theta_scale, *price_numbers(rule.price)" \
  tests/test_compiled_levels.py
plant "tau counting the prefill's token" sage_engine/core/events.py \
  "mean_accepted=decode_tokens / len(decode) if decode else 0.0" "mean_accepted=(decode_tokens + 1) / len(decode) if decode else 0.0" \
  tests/test_cli.py::test_generate_json_matches_ar_and_reports_stats
plant "a reused policy object carrying its history into the next run" sage_engine/core/engine.py \
  "        policy.reset()  # a policy object used again" "        pass  # a policy object used again" \
  tests/test_extending.py::test_a_policy_object_used_again_starts_afresh
plant "sage reading the machine's prices (unpriced trees that depend on the clock)" sage_engine/policies/sage.py \
  "int(cfg.w_min), int(cfg.w_max), int(cfg.n_max))" "int(cfg.w_min), int(cfg.w_max), int(cfg.n_max), quote and quote.break_even())" \
  tests/test_extending.py::test_sage_draws_the_same_trees_whatever_the_meter_has_seen
plant "a window rolled one column further than no query sees" sage_engine/models/columns.py \
  "k = min(k, n - 1)  # keep one column" "k = min(k + 1, n - 1)  # keep one column" \
  "tests/test_layer_kinds.py::test_every_policy_equals_ar_past_the_window"
plant "a recurrent plain step that forgets the carried path (commit)" sage_engine/models/recurrent_paths.py \
  "logits = self._read(model, cache, self.tokens + tokens, self.positions + positions, device, len(tokens))" \
  "logits = self._read(model, cache, tokens, positions, device, len(tokens))" \
  tests/test_layer_kinds.py
plant "an input's speedup taken upside down (ar's tokens/s over the policy's)" sage_engine/evaluation/bench.py \
  "return statistics.median(run.stats.tokens_per_second / ar.stats.tokens_per_second" \
  "return statistics.median(ar.stats.tokens_per_second / run.stats.tokens_per_second" \
  tests/test_cli.py tests/test_report.py

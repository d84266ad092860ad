"""lpjax.rollout: sampled tokens' log-probs match the training model's in fp32 and differ slightly in fp8,
a changed weight changes the rollout after sync, top-p and EOS masking, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lpjax.agents.grpo import sequence_logprobs
from lpjax.nn.causal_lm import transformer_causal_lm
from lpjax.rollout import RolloutEngine, SamplingSettings, sample
from lpjax.tasks.synthetic import make_task

TASK = make_task("addition", 2)
LM = dict(vocab_size=TASK.vocab_size, num_layers=1, num_heads=2, d_model=32, d_ff=64, max_len=16)
NEW = TASK.seq_len - TASK.prompt_len
EOS = 2


@pytest.fixture(scope="module")
def setup():
    model = transformer_causal_lm(LM)
    params = model.init(jax.random.key(0), jnp.zeros((1, TASK.seq_len), jnp.int32))
    prompts = jnp.asarray(TASK.sample_prompts(np.random.default_rng(0), 16))
    return model, params, prompts


def _training_logp(model, params, prompts, out):
    tokens = jnp.concatenate([prompts, out["completions"]], axis=1)
    return sequence_logprobs(model.logits(params, tokens), tokens)[:, prompts.shape[1] :]


def test_fp32_rollout_logprobs_equal_the_training_models(setup):
    model, params, prompts = setup
    out = sample(model, params, prompts, jax.random.key(1), SamplingSettings(NEW, EOS))
    assert out["completions"].shape == (16, NEW) and out["completions"].dtype == jnp.int32
    np.testing.assert_allclose(out["logp"], _training_logp(model, params, prompts, out), atol=1e-5)
    after_eos = np.cumsum(np.asarray(out["completions"]) == EOS, axis=1) - (np.asarray(out["completions"]) == EOS)
    np.testing.assert_array_equal(np.asarray(out["mask"]), (after_eos == 0).astype(np.float32))


def test_fp8_rollout_is_close_but_not_equal_and_follows_synced_weights(setup):
    model, params, prompts = setup
    engine = RolloutEngine(
        transformer_causal_lm(dict(LM, policy="fp8"), kv_cache_dtype="fp8"), SamplingSettings(NEW, EOS)
    )
    with pytest.raises(RuntimeError, match="before the first sync"):
        engine.rollout(prompts, jax.random.key(1))
    engine.sync(params, 0, prompts)
    out = engine.rollout(prompts, jax.random.key(1))
    gap = np.abs(np.asarray(out["logp"] - _training_logp(model, params, prompts, out)))
    assert 1e-4 < gap.max() < 0.5  # the fp8 GEMMs and KV cache perturb the policy, mildly
    changed = jax.tree.map(lambda x: x, params)
    changed["params"]["lm_head"]["kernel"] = changed["params"]["lm_head"]["kernel"] * 3.0
    engine.sync(changed, 1, prompts)
    again = engine.rollout(prompts, jax.random.key(1))
    assert engine.version == 1 and not np.allclose(np.asarray(again["logp"]), np.asarray(out["logp"]))


def test_top_p_keeps_only_the_nucleus(setup):
    model, params, prompts = setup
    greedy = sample(model, params, prompts, jax.random.key(2), SamplingSettings(NEW, EOS, top_p=1e-6))
    np.testing.assert_allclose(np.asarray(greedy["logp"]), 0.0, atol=1e-6)  # one token left: probability 1
    argmax = sample(model, params, prompts, jax.random.key(3), SamplingSettings(NEW, EOS, temperature=1e-4))
    np.testing.assert_array_equal(np.asarray(greedy["completions"]), np.asarray(argmax["completions"]))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=0.0), "temperature"), (dict(top_p=1.5), "top_p")],
)
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingSettings(**(dict(max_new_tokens=4, eos_id=EOS) | kwargs))

"""Acceptance: on naive-fp16 SAC the report names the ops Björck et al. (2021) fix; with the methods they are gone.

The four: Adam's second moment ``g^2`` underflowing, Adam's ``eps`` rounding to 0 (both seen in the critic's
first update from a fresh initialisation, which is where naive fp16 breaks), the Gaussian's variance ``sigma^2``
underflowing, and the ``exp`` of PyTorch's softplus overflowing. The last two appear once the policy is nearly
deterministic and saturated, as trained SAC policies become; the actor's last layer is set so for the actor's
report (its nan/inf would otherwise also reach the critic's targets and hide the critic's underflows).
"""

import jax
import jax.numpy as jnp
import pytest

from lpjax.agents import sac
from lpjax.inspect import precision_report
from lpjax.methods import PrecisionMethods

OBS_DIM, ACTION_DIM, BATCH = 5, 2, 32
SQUASHED_GAUSSIAN = "lpjax/agents/sac/squashed_gaussian.py"


def fresh_state(methods: bool) -> sac.SACState:
    config = sac.SACConfig(
        policy="fp16",
        hidden_dims=(32, 32),
        batch_size=BATCH,
        methods=PrecisionMethods.paper() if methods else PrecisionMethods(),
    )
    return sac.init(jax.random.key(0), jnp.zeros(OBS_DIM), ACTION_DIM, config)


def late_training_state(methods: bool) -> sac.SACState:
    """fp16 SAC whose actor outputs mean -8 (actions saturated at -1) and log-std at its bound -5."""
    state = fresh_state(methods)
    params = jax.tree.map(lambda x: x, state.actor.params)
    head = params["params"]["MLP_0"]["Dense_2"]
    head["kernel"] = head["kernel"] * 0.01
    head["bias"] = jnp.concatenate([jnp.full(ACTION_DIM, -8.0), jnp.full(ACTION_DIM, -6.0)]).astype(head["bias"].dtype)
    return state.replace(actor=state.actor._replace(params=params))


def batch():
    keys = jax.random.split(jax.random.key(1), 3)
    obs = jax.random.normal(keys[0], (BATCH, OBS_DIM))
    return dict(
        obs=obs,
        action=jax.random.uniform(keys[1], (BATCH, ACTION_DIM), minval=-1, maxval=1),
        reward=jax.random.uniform(keys[2], (BATCH,)),
        discount=jnp.ones(BATCH),
        next_obs=obs[::-1],
    )


def the_four(critic_report, actor_report) -> dict[str, list]:
    """The rows of the paper's four problems (non-harmless flagged rows only)."""

    def find(report, **criteria):
        return [row for row in report.find(**criteria) if row.harmless is None]

    return {
        "g^2 underflow": [
            row
            for row in find(critic_report, primitive="integer_pow", scope="optimizer")
            if row.underflow_frac > 0 and row.source.startswith("optax")
        ],
        "eps rounds to 0": [row for row in find(critic_report, scope="optimizer") if row.zero_constant],
        "variance underflow": [
            row for row in find(actor_report, primitive="square", source=SQUASHED_GAUSSIAN) if row.underflow_frac > 0
        ],
        "softplus exp overflow": [
            row for row in find(actor_report, primitive="exp", source=SQUASHED_GAUSSIAN) if row.overflow_frac > 0
        ],
    }


@pytest.fixture(scope="module")
def reports():
    data = batch()
    out = {}
    for name, methods in (("naive", False), ("methods", True)):
        out[name] = (
            precision_report(sac.critic_update, fresh_state(methods), data, jax.random.key(2), dtype=None),
            precision_report(
                sac.actor_update, late_training_state(methods), data["obs"], jax.random.key(3), dtype=None
            ),
        )
    return out


def test_naive_fp16_report_names_the_four_problems_the_paper_fixes(reports):
    found = the_four(*reports["naive"])
    assert all(found.values()), {name: len(rows) for name, rows in found.items()}
    assert "hadam" in found["g^2 underflow"][0].suggestion
    assert "compound_loss_scaling" in found["eps rounds to 0"][0].suggestion
    assert "normal-fix" in found["variance underflow"][0].suggestion
    assert "softplus-fix" in found["softplus exp overflow"][0].suggestion
    for problem, switch in (
        ("g^2 underflow", "hadam"),
        ("eps rounds to 0", "loss_scaling"),
        ("variance underflow", "normal_fix"),
        ("softplus exp overflow", "softplus_fix"),
    ):
        assert f"methods.{switch}" in found[problem][0].suggestion, problem  # the switch of SACConfig.methods
    assert found["softplus exp overflow"][0].severity == "error"


def test_with_all_six_methods_those_rows_are_gone_and_nothing_is_an_error(reports):
    critic, actor = reports["methods"]
    assert not any(the_four(critic, actor).values())
    for report in (critic, actor):
        assert not [row for row in report.flagged(include_harmless=False) if row.severity == "error"]
        assert all(row.harmless for row in report.flagged() if row.source.startswith("lpjax/optim/kahan.py"))


def test_phases_carry_their_scopes_and_the_report_matches_the_update(reports):
    critic, actor = reports["naive"]
    scopes = {row.scope.split("/")[0] for row in critic.rows} | {row.scope.split("/")[0] for row in actor.rows}
    assert {"critic", "target", "actor", "temperature"} <= scopes
    assert any(row.backward and "Dense" in row.scope for row in critic.rows)
    assert any("transpose(" in row.name_stack and row.backward for row in critic.rows)
    state, data = late_training_state(True), batch()
    expected, _ = sac.critic_update(state, data, jax.random.key(2))
    inspected, _ = precision_report(sac.critic_update, state, data, jax.random.key(2), dtype=None).outputs
    for a, b in zip(jax.tree.leaves(expected.critic.params), jax.tree.leaves(inspected.critic.params)):
        assert jnp.allclose(a.astype(jnp.float32), b.astype(jnp.float32), rtol=2e-3, atol=1e-4)

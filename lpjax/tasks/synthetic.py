"""Verifiable synthetic tasks for RL on language models: addition, copy and sort, with exact rewards.

Everything is generated locally from a ``numpy.random.Generator``: no downloads. Sequences are characters of
:data:`TOKENIZER` (ids ``0 PAD, 1 BOS, 2 EOS``, then ``0-9``, ``+``, ``=``), with fixed lengths per task::

    addition (n digits):  BOS a + b =   answer: a + b in n + 1 digits, zero-padded     "07+45=" -> "052"
    copy     (n digits):  BOS x =       answer: x                                       "3141="  -> "3141"
    sort     (n digits):  BOS x =       answer: the digits of x in ascending order      "3141="  -> "1134"

and the answer is followed by EOS. Operands are zero-padded to ``n`` digits, so every prompt of a task has
``task.prompt_len`` tokens and every answer ``task.answer_len`` digits; a completion is right if it starts with the
answer's digits and then EOS (whatever follows the EOS is ignored). Rewards are exact: :meth:`Task.rewards` gives
1 or 0 (or, with ``partial=True``, the fraction of the ``answer_len + 1`` answer-and-EOS positions that are right)
and is written in ``jax.numpy`` with static shapes, so it runs inside ``jit`` next to the rollout.

A short supervised warm start (:func:`warm_start`) trains the LM on :func:`sft_batch` sequences (cross entropy on
the answer and its EOS only) so that RL starts from a policy with non-trivial reward. Its accuracy is the
teacher-forced exact match: every answer token and the EOS are the argmax given the correct prefix, which is
exactly when greedy decoding produces the answer (reward 1), computed in one forward pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lpjax.nn.causal_lm import CausalLM, as_causal_lm


class CharTokenizer:
    """Character-level tokenizer: ids 0, 1, 2 are PAD, BOS, EOS; then one id per character of ``chars``.

    ``encode("12+3=") -> [4, 5, 13, 6, 14]``; ``decode`` maps ids back, dropping special tokens and stopping at
    the first EOS by default.
    """

    PAD, BOS, EOS = 0, 1, 2
    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self, chars: str = "0123456789+="):
        if len(set(chars)) != len(chars):
            raise ValueError(f"chars must be distinct, got {chars!r}.")
        self.chars = chars
        self.vocab = self.SPECIALS + tuple(chars)
        self._ids = {c: i + len(self.SPECIALS) for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        """Number of token ids (specials included)."""
        return len(self.vocab)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> np.ndarray:
        """int32 ids of ``text``, optionally with a leading BOS and a trailing EOS; ``ValueError`` for unknown chars."""
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"Characters {unknown} are not in the vocabulary {self.chars!r}.")
        ids = [self._ids[c] for c in text]
        return np.asarray([self.BOS] * bos + ids + [self.EOS] * eos, np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray, stop_at_eos: bool = True, keep_special: bool = False) -> str:
        """The text of ``ids``: special tokens dropped (or shown as ``<bos>`` etc.), cut at the first EOS."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.EOS and stop_at_eos:
                break
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"Token id {i} is outside the vocabulary (size {self.vocab_size}).")
            if i >= len(self.SPECIALS) or keep_special:
                out.append(self.vocab[i])
        return "".join(out)


TOKENIZER = CharTokenizer()
"""The tokenizer of all synthetic tasks (vocabulary size 15)."""

TASKS = ("addition", "copy", "sort")
"""Names of the synthetic tasks."""

_DIGIT0 = TOKENIZER.encode("0")[0]


@dataclasses.dataclass(frozen=True)
class Task:
    """A synthetic task with exact rewards (see the module docstring for the formats).

    Attributes:
      name: ``"addition"``, ``"copy"`` or ``"sort"``.
      num_digits: digits per operand (addition) or of the string (copy, sort).
    """

    name: str
    num_digits: int = 2

    def __post_init__(self):
        if self.name not in TASKS:
            raise ValueError(f"Unknown task {self.name!r}; valid: {TASKS}.")
        n = self.num_digits
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 9:
            raise ValueError(f"num_digits must be an int in [1, 9], got {n!r}.")

    @property
    def tokenizer(self) -> CharTokenizer:
        """:data:`TOKENIZER`."""
        return TOKENIZER

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (15)."""
        return TOKENIZER.vocab_size

    @property
    def prompt_len(self) -> int:
        """Tokens per prompt, BOS and ``=`` included."""
        return 2 * self.num_digits + 3 if self.name == "addition" else self.num_digits + 2

    @property
    def answer_len(self) -> int:
        """Digits per answer (EOS excluded)."""
        return self.num_digits + 1 if self.name == "addition" else self.num_digits

    @property
    def seq_len(self) -> int:
        """Length of a full sequence: prompt, answer, EOS (the model's ``max_len`` must be at least this)."""
        return self.prompt_len + self.answer_len + 1

    def sample_prompts(self, rng: np.random.Generator, batch_size: int) -> np.ndarray:
        """``(batch_size, prompt_len)`` int32 prompts with uniformly random digits, deterministic given ``rng``."""
        n = self.num_digits
        digits = rng.integers(0, 10, size=(batch_size, 2 * n if self.name == "addition" else n)) + _DIGIT0
        bos = np.full((batch_size, 1), TOKENIZER.BOS)
        plus, equals = (np.full((batch_size, 1), TOKENIZER.encode(c)[0]) for c in "+=")
        parts = [bos, digits[:, :n], plus, digits[:, n:], equals] if self.name == "addition" else [bos, digits, equals]
        return np.concatenate(parts, axis=1).astype(np.int32)

    def answers(self, prompts: jax.Array) -> jax.Array:
        """``(B, answer_len)`` int32 answer tokens (no EOS) of ``(B, prompt_len)`` prompts; jit-friendly."""
        prompts = jnp.asarray(prompts)
        if prompts.ndim != 2 or prompts.shape[1] != self.prompt_len:
            raise ValueError(f"prompts must have shape (batch, {self.prompt_len}), got {prompts.shape}.")
        n = self.num_digits
        if self.name == "copy":
            return prompts[:, 1 : n + 1].astype(jnp.int32)
        if self.name == "sort":
            return jnp.sort(prompts[:, 1 : n + 1], axis=1).astype(jnp.int32)
        powers = 10 ** jnp.arange(n - 1, -1, -1, dtype=jnp.int32)
        a = jnp.sum((prompts[:, 1 : n + 1] - _DIGIT0) * powers, axis=1)
        b = jnp.sum((prompts[:, n + 2 : 2 * n + 2] - _DIGIT0) * powers, axis=1)
        out_powers = 10 ** jnp.arange(n, -1, -1, dtype=jnp.int32)
        return ((a + b)[:, None] // out_powers % 10 + _DIGIT0).astype(jnp.int32)

    def rewards(self, prompts: jax.Array, completions: jax.Array, partial: bool = False) -> jax.Array:
        """``(B,)`` float32 rewards of ``completions (B, C)`` (the generated tokens after each prompt).

        Exact (default): 1 if ``completions[b, :answer_len]`` is the answer and ``completions[b, answer_len]`` is
        EOS, else 0 (also 0 when ``C <= answer_len``). ``partial=True``: the fraction of those ``answer_len + 1``
        positions that hold the right token. Tokens after the answer's EOS are ignored. Jit-friendly.
        """
        completions = jnp.asarray(completions)
        if completions.ndim != 2 or completions.shape[0] != jnp.shape(prompts)[0]:
            raise ValueError(
                f"completions must be (batch, length) with the prompts' batch, got {completions.shape} "
                f"for prompts {jnp.shape(prompts)}."
            )
        target = jnp.concatenate(
            [self.answers(prompts), jnp.full((completions.shape[0], 1), TOKENIZER.EOS, jnp.int32)], axis=1
        )
        width = target.shape[1]
        got = completions[:, :width]
        got = jnp.pad(got, ((0, 0), (0, width - got.shape[1])), constant_values=-1)
        correct = got == target
        return (jnp.mean(correct, axis=1) if partial else jnp.all(correct, axis=1)).astype(jnp.float32)

    def reward(
        self, prompt: Sequence[int] | np.ndarray, completion: Sequence[int] | np.ndarray, partial: bool = False
    ) -> float:
        """The reward of one ``prompt`` and its ``completion`` tokens, as a Python float (see :meth:`rewards`)."""
        prompt = np.asarray(prompt, np.int32)[None]
        completion = np.asarray(completion, np.int32).reshape(1, -1)
        return float(self.rewards(prompt, completion, partial)[0])


def make_task(name: str, num_digits: int = 2) -> Task:
    """The :class:`Task` ``name`` (``"addition"``, ``"copy"`` or ``"sort"``) on ``num_digits`` digits."""
    return Task(name, num_digits)


def sft_batch(task: Task, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Supervised sequences ``prompt + answer + EOS`` and the mask of the tokens to learn.

    Returns:
      ``(tokens, mask)``, both ``(batch_size, task.seq_len)``: int32 tokens and a float32 mask that is 1 exactly on
      the answer digits and the EOS after them. Train on ``logits(tokens[:, :-1])`` against ``tokens[:, 1:]``
      weighted by ``mask[:, 1:]``.
    """
    prompts = task.sample_prompts(rng, batch_size)
    answers = np.asarray(task.answers(prompts))
    eos = np.full((batch_size, 1), TOKENIZER.EOS, np.int32)
    tokens = np.concatenate([prompts, answers, eos], axis=1)
    mask = np.zeros(tokens.shape, np.float32)
    mask[:, task.prompt_len :] = 1.0
    return tokens, mask


def sft_loss_and_accuracy(logits_fn, params: Any, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Masked next-token cross entropy (mean over masked tokens) and teacher-forced exact-match accuracy.

    Args:
      logits_fn: ``(params, tokens (B, T)) -> (B, T, V)``, e.g. ``CausalLM.logits``.
      params: its parameters.
      tokens, mask: from :func:`sft_batch`.

    Returns:
      ``(loss, accuracy)``: float32 scalars; ``accuracy`` is the fraction of sequences whose masked tokens are all
      the argmax of their logits (= the greedy-decoding reward, up to ties).
    """
    logits = logits_fn(params, tokens[:, :-1]).astype(jnp.float32)
    targets, weights = tokens[:, 1:], mask[:, 1:]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    loss = jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    right = (jnp.argmax(logits, axis=-1) == targets) | (weights == 0)
    return loss, jnp.mean(jnp.all(right, axis=1).astype(jnp.float32))


class WarmStartCurve(NamedTuple):
    """Learning curve of :func:`warm_start`, one entry per evaluation.

    Attributes:
      step: ``(E,)`` int, training steps done at each evaluation (0 = before training).
      loss: ``(E,)`` float, masked cross entropy on the evaluation set.
      accuracy: ``(E,)`` float, teacher-forced exact match (= greedy reward) on the evaluation set.
      seconds: ``(E,)`` float, wall-clock time since the start (compilation included).
    """

    step: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    seconds: np.ndarray


def warm_start(
    model: CausalLM | Any,
    params: Any,
    task: Task,
    steps: int = 1000,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    eval_every: int = 25,
    eval_size: int = 512,
    target_accuracy: float | None = 0.3,
) -> tuple[Any, WarmStartCurve]:
    """Short supervised training on :func:`sft_batch` so that RL starts from a policy with non-trivial reward.

    Adam (``learning_rate``, gradients clipped to global norm 1) on the masked cross entropy of
    :func:`sft_loss_and_accuracy`, with fresh random sequences every step from ``numpy.random.default_rng(seed)``;
    evaluated every ``eval_every`` steps (and at 0 and at the end) on ``eval_size`` fixed sequences drawn from
    ``default_rng(seed + 1)``.

    Args:
      model: a :class:`~lpjax.nn.causal_lm.CausalLM` or a :class:`~lpjax.nn.transformer.TransformerLM`; its
        ``max_len`` must be at least ``task.seq_len - 1``.
      params: initial parameters (``model.init``).
      task: the :class:`Task`.
      steps: maximum number of training steps.
      batch_size: sequences per step.
      learning_rate: Adam's step size.
      seed: seed of the training and evaluation data.
      eval_every: steps between evaluations.
      eval_size: evaluation sequences.
      target_accuracy: stop at the first evaluation reaching it (``None``: run all ``steps``). The default 0.3
        leaves RL room to improve: a 2-layer, d_model 64, 4-head model (~100k parameters) passes 30% on 2-digit
        addition after ~175 steps and solves it after ~1000.

    Returns:
      ``(params, curve)``: the trained parameters and a :class:`WarmStartCurve`.
    """
    model = as_causal_lm(model)
    if model.max_len < task.seq_len - 1:
        raise ValueError(
            f"The model's max_len {model.max_len} is shorter than task {task.name!r} needs ({task.seq_len - 1})."
        )
    if model.vocab_size < task.vocab_size:
        raise ValueError(
            f"The model's vocab_size {model.vocab_size} is smaller than the tokenizer's {task.vocab_size}."
        )
    if steps < 0 or eval_every <= 0 or batch_size <= 0 or eval_size <= 0:
        raise ValueError("steps must be >= 0 and eval_every, batch_size, eval_size > 0.")
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))
    metrics = jax.jit(lambda p, t, m: sft_loss_and_accuracy(model.logits, p, t, m))

    @jax.jit
    def train_step(params, opt_state, tokens, mask):
        grads = jax.grad(lambda p: sft_loss_and_accuracy(model.logits, p, tokens, mask)[0])(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    rng = np.random.default_rng(seed)
    eval_tokens, eval_mask = sft_batch(task, np.random.default_rng(seed + 1), eval_size)
    opt_state = optimizer.init(params)
    start = time.perf_counter()
    curve: list[tuple[int, float, float, float]] = []

    def evaluate(step: int) -> float:
        loss, accuracy = metrics(params, eval_tokens, eval_mask)
        curve.append((step, float(loss), float(accuracy), time.perf_counter() - start))
        return float(accuracy)

    accuracy = evaluate(0)
    for step in range(1, steps + 1):
        if target_accuracy is not None and accuracy >= target_accuracy:
            break
        params, opt_state = train_step(params, opt_state, *sft_batch(task, rng, batch_size))
        if step % eval_every == 0 or step == steps:
            accuracy = evaluate(step)
    step, loss, acc, seconds = (np.asarray(c) for c in zip(*curve))
    return params, WarmStartCurve(step.astype(np.int64), loss, acc, seconds)

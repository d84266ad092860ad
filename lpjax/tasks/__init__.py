"""Verifiable synthetic tasks for RL on language models (addition, copy, sort), their tokenizer and warm start."""

from lpjax.tasks.synthetic import (
    TASKS,
    TOKENIZER,
    CharTokenizer,
    Task,
    WarmStartCurve,
    make_task,
    sft_batch,
    sft_loss_and_accuracy,
    warm_start,
)

__all__ = [
    "TASKS",
    "TOKENIZER",
    "CharTokenizer",
    "Task",
    "WarmStartCurve",
    "make_task",
    "sft_batch",
    "sft_loss_and_accuracy",
    "warm_start",
]

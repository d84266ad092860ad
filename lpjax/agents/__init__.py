"""Learners as pure state + update functions: :mod:`lpjax.agents.sac`."""

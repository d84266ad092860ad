"""``python -m lpjax.inspect --config=fp16_naive.py --algo=sac`` (see :mod:`lpjax.inspect.cli`)."""

from absl import flags

from lpjax.inspect import cli

__doc__ = cli.__doc__  # absl's --help prints the main module's docstring
flags.adopt_module_key_flags(cli)  # --help lists the inspector's flags

if __name__ == "__main__":
    cli.run()

"""SAC from pixels in fp32, the reference for ``pixels.py`` (same hyper-parameters, no fp16 methods)."""

from experiments.configs.sac import pixels


def get_config():
    config = pixels.get_config()
    config.agent.update(policy="fp32", hadam=False, loss_scaling=False, kahan_gradients=False,
                        kahan_momentum=False, softplus_fix=False, normal_fix=False, weight_standardization=False,
                        encoder_clip=None)
    return config

"""A ModelConfig pickles as its serialized bytes: the class tritonclient generates names a
module ('model_config_pb2') that pickle cannot import under that name, and a config
travels pickled between a front-end process and the main process (service.ASKED).
Registered when config/ is imported, so every process that handles configs has it."""

from __future__ import annotations

import copyreg

from tritonclient.grpc import model_config_pb2 as mc


def _model_config_from(serialized: bytes) -> mc.ModelConfig:
    return mc.ModelConfig.FromString(serialized)


copyreg.pickle(mc.ModelConfig,
               lambda config: (_model_config_from, (config.SerializeToString(),)))

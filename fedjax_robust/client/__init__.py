"""Local-training kernels for ONE client, written once and mapped over the client axis."""

from fedjax_robust.client.local_sgd import (
    Batch,
    BatchTransform,
    ClientData,
    LocalResult,
    LossFn,
    plain_loss,
    LocalTrainSpec,
    epoch_permutations,
    local_train,
    masked_cross_entropy,
    num_local_steps,
    steps_per_epoch,
)

__all__ = [
    "Batch",
    "BatchTransform",
    "ClientData",
    "LocalResult",
    "LossFn",
    "plain_loss",
    "LocalTrainSpec",
    "epoch_permutations",
    "local_train",
    "masked_cross_entropy",
    "num_local_steps",
    "steps_per_epoch",
]

"""Attacks: model poisoning of the stacked uploads, and data poisoning of malicious clients' data.

Model poisoning: a :class:`ModelAttack` is ``apply(updates, malicious, key, context) -> updates``
on ``[C, ...]`` pytrees (see :mod:`fedjax_robust.attacks.base`); build one with
:func:`make_attack` / :func:`attack_from_config`, plug it into the engine with
:func:`as_upload_transform`. Data poisoning (label flips, BadNets and DBA
triggers) acts once on :class:`~fedjax_robust.data.FederatedData` at set-up.
"""

from fedjax_robust.attacks.base import ModelAttack, as_upload_transform, craft, ravel_stack
from fedjax_robust.attacks.data_poisoning import (add_pixel_trigger, backdoor_poison, choose_malicious,
                                                  dba_trigger_parts, default_poison_config, flip_labels,
                                                  make_trigger, poison_federated_data, semantic_backdoor_set,
                                                  triggered_test_set)
from fedjax_robust.attacks.fang import (fang_krum, fang_lambda0, fang_median, fang_trimmed_mean,
                                        krum_select)
from fedjax_robust.attacks.model_poisoning import (boosting, craft_min_max_sum, exaggerate, gamma_search,
                                                   gaussian, identity, ipm, lie, lie_z, min_max, min_sum, scaling,
                                                   sign_flip)
from fedjax_robust.attacks.registry import (ATTACKS, OWN_UPDATE_ATTACKS, attack_from_config, attack_params,
                                            make_attack, upload_fields_from_config)
from fedjax_robust.attacks.requests import RequestPoisoner, request_poisoner

__all__ = [
    "ModelAttack", "as_upload_transform", "craft", "ravel_stack", "add_pixel_trigger", "backdoor_poison",
    "choose_malicious", "dba_trigger_parts", "default_poison_config", "flip_labels", "make_trigger",
    "poison_federated_data", "semantic_backdoor_set", "triggered_test_set", "fang_krum", "fang_lambda0",
    "fang_median", "fang_trimmed_mean", "krum_select", "boosting", "craft_min_max_sum", "exaggerate",
    "gamma_search", "gaussian", "identity", "ipm", "lie", "lie_z", "min_max", "min_sum", "scaling", "sign_flip",
    "ATTACKS", "OWN_UPDATE_ATTACKS", "attack_from_config", "attack_params", "make_attack",
    "upload_fields_from_config", "RequestPoisoner", "request_poisoner",
]

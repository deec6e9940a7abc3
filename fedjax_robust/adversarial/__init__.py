"""Adversarial robustness as a library: attack kernels, adversarial training objectives, robust evaluation.

* :mod:`~fedjax_robust.adversarial.attacks`: FGSM, BIM, PGD, CW-L∞, CW-L2 kernels
  ``(logits_fn, variables, x, y, key, params) -> x_adv``.
* :mod:`~fedjax_robust.adversarial.calibration`: FedALC's logits calibration, CalFAT's log prior.
* :mod:`~fedjax_robust.adversarial.objectives`: local training objectives (``adversarial.objective``).
* :mod:`~fedjax_robust.adversarial.evaluation`: robust accuracy of a model on a dataset, the ``robust`` evaluator.
"""

from fedjax_robust.adversarial.attacks import (CWParams, LinfParams, bim, cross_entropy, cw_l2, cw_linf, cw_margin,
                                               fgsm, linf_ascent, pgd, project_linf, training_attack_unroll)
from fedjax_robust.adversarial.calibration import (calibrate_logits, calibrated_cross_entropy, calibration_weights,
                                                   class_counts)
from fedjax_robust.adversarial.evaluation import (RobustEvalSpec, default_robust_eval_config, evaluate_robust,
                                                  robust_accuracy, robust_eval_from_config)
from fedjax_robust.adversarial.objectives import (OBJECTIVES, Objective, adversarial_config, objective_from_config,
                                                  register_objective)

__all__ = [
    "CWParams", "LinfParams", "bim", "cross_entropy", "cw_l2", "cw_linf", "cw_margin", "fgsm", "linf_ascent", "pgd",
    "project_linf", "training_attack_unroll", "calibrate_logits", "calibrated_cross_entropy", "calibration_weights",
    "class_counts",
    "RobustEvalSpec", "default_robust_eval_config", "evaluate_robust", "robust_accuracy", "robust_eval_from_config",
    "OBJECTIVES", "Objective", "adversarial_config", "objective_from_config", "register_objective",
]

"""fedjax_robust: a JAX federated-learning simulator for robustness and personalization.

Every client lives on a leading axis of one stacked pytree, so a whole round
(local SGD, attacks, aggregation) is one compiled program.
"""

__version__ = "0.1.0"

"""Model zoo and registry.

    model = get_model('fedavg_cnn', num_classes=10, fc_dim=64)
    params = init_params(model, jax.random.key(0), (32, 32, 3))
    logits = model.apply({'params': params}, x)                      # [B, 10]
    feats = model.apply({'params': params}, x, method='features')    # [B, 64]
    base, head = split_base_head(params)                              # head = params['head']

From an ml_collections config ``config.model = {name: 'fedavg_cnn', fc_dim: 64}``:
``get_model_from_config(config.model, num_classes)`` (or
``get_model(**config.model, num_classes=...)``). ``init='torch'|'flax'`` is
accepted as an alias of the modules' ``init_scheme`` field (a flax module
field cannot be called ``init``). Conv nets take ``conv_impl='xla'|'patches'``
(how each convolution is computed; same params), e.g.
``config.model = {name: 'fedavg_cnn', fc_dim: 64, conv_impl: 'patches'}``.
See ``classifiers.py`` for the common API.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_robust.models.classifiers import (BNCNN, AlexNet28, CifarCNN, EMNISTCNN,
                                              FedAvgCNN, FedCCCifarCNN,
                                              FedCCFMNISTCNN, HARCNN, LeNet5,
                                              MLP, MnistCNN)
from fedjax_robust.models.interface import (Model, as_model, as_variables,
                                            make_model, merge_variables,
                                            require_stateless, split_variables,
                                            stateless_apply, train_logits)
from fedjax_robust.models.resnet import (CifarResNet18, ResNet, ResNet8, ResNet10, ResNet18,
                                         load_pretrained,
                                         torch_state_dict_from_variables,
                                         variables_from_torch_state_dict)
from fedjax_robust.models.layers import (CONV_IMPLS, INIT_SCHEMES, TorchConv,
                                         TorchDense, check_conv_impl,
                                         torch_uniform_init)

MODELS: dict[str, type[nn.Module]] = {
    "mlp": MLP,
    "fedavg_cnn": FedAvgCNN,
    "emnist_cnn": EMNISTCNN,
    "har_cnn": HARCNN,
    "lenet5": LeNet5,
    "cifar_cnn": CifarCNN,
    "bn_cnn": BNCNN,
    "fedcc_fmnist_cnn": FedCCFMNISTCNN,
    "fedcc_cifar_cnn": FedCCCifarCNN,
    "cnn_mnist": MnistCNN,
    "resnet18": ResNet18,
    "resnet8": ResNet8,
    "resnet10": ResNet10,
    "alexnet28": AlexNet28,
    "cifar_resnet18": CifarResNet18,
}

# The input shape (H, W, C) each model was specified for (the MLP takes any).
DEFAULT_INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "mlp": (8, 8, 1),
    "fedavg_cnn": (32, 32, 3),
    "emnist_cnn": (28, 28, 1),
    "har_cnn": (1, 200, 3),
    "lenet5": (28, 28, 1),
    "cifar_cnn": (32, 32, 3),
    "bn_cnn": (32, 32, 3),
    "fedcc_fmnist_cnn": (28, 28, 1),
    "fedcc_cifar_cnn": (32, 32, 3),
    "cnn_mnist": (28, 28, 1),
    "resnet18": (32, 32, 3),  # CIFAR-10, not resized (FedALC §4.3)
    "resnet8": (32, 32, 3),
    "resnet10": (32, 32, 3),  # CIFAR-100; Tiny-ImageNet is 64x64x3
    "alexnet28": (28, 28, 1),  # FedVSA FMNIST
    "cifar_resnet18": (32, 32, 3),  # FedVSA CIFAR-10
}

_RESERVED_FIELDS = ("parent", "name", "num_classes")


def model_kwargs(name: str) -> tuple[str, ...]:
  """The keyword arguments ``get_model(name, ...)`` accepts (besides num_classes)."""
  cls = _lookup(name)
  fields = [f.name for f in dataclasses.fields(cls)
            if f.init and f.name not in _RESERVED_FIELDS]
  return tuple(fields) + ("init",)


def _lookup(name: str) -> type[nn.Module]:
  key = str(name).lower()
  if key not in MODELS:
    raise ValueError(
        f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
  return MODELS[key]


def _to_static(value: Any) -> Any:
  """Lists (e.g. from a ConfigDict / YAML) -> tuples, so module fields hash."""
  if isinstance(value, (list, tuple)):
    return tuple(_to_static(v) for v in value)
  return value


def get_model(name: str, num_classes: int, **kwargs: Any) -> nn.Module:
  """Builds model ``name`` with ``num_classes`` outputs; kwargs go to the module.

  Raises ValueError for an unknown name or a keyword the module does not take.
  """
  cls = _lookup(name)
  accepted = model_kwargs(name)
  unknown = sorted(k for k in kwargs if k not in accepted)
  if unknown:
    raise ValueError(
        f"model {name!r} got unknown keyword argument(s) {unknown}; "
        f"accepted: {', '.join(accepted)}")
  if "init" in kwargs:
    if "init_scheme" in kwargs and kwargs["init_scheme"] != kwargs["init"]:
      raise ValueError("pass only one of 'init' and 'init_scheme'")
    kwargs["init_scheme"] = kwargs.pop("init")
  scheme = kwargs.get("init_scheme", "torch")
  if scheme not in INIT_SCHEMES:
    raise ValueError(
        f"unknown init scheme {scheme!r}; expected one of {INIT_SCHEMES}")
  if "conv_impl" in kwargs:
    check_conv_impl(kwargs["conv_impl"])
  kwargs = {k: _to_static(v) for k, v in kwargs.items()}
  return cls(num_classes=int(num_classes), **kwargs)


def get_model_from_config(config: Mapping[str, Any],
                          num_classes: int | None = None) -> nn.Module:
  """``get_model`` from a mapping / ConfigDict holding ``name`` and kwargs.

  ``num_classes`` may be given here or as ``config.num_classes`` (the argument
  wins when both are present).
  """
  cfg = dict(config.to_dict() if hasattr(config, "to_dict") else config)
  if "name" not in cfg:
    raise ValueError(f"model config needs a 'name'; got keys {sorted(cfg)}")
  name = cfg.pop("name")
  cfg_classes = cfg.pop("num_classes", None)
  if num_classes is None:
    num_classes = cfg_classes
  if num_classes is None:
    raise ValueError("num_classes must be given (argument or config)")
  return get_model(name, num_classes, **cfg)


def init_params(model: nn.Module, key: jax.Array,
                input_shape: Sequence[int]) -> dict:
  """``model.init(key, zeros((1, *input_shape)))['params']`` (float32)."""
  x = jnp.zeros((1,) + tuple(int(d) for d in input_shape), jnp.float32)
  return model.init(key, x)["params"]


def count_params(params: Any) -> int:
  """Total number of scalars in a parameter pytree."""
  return int(sum(np.prod(np.shape(p), dtype=np.int64)
                 for p in jax.tree_util.tree_leaves(params)))


def split_base_head(params: Mapping[str, Any]) -> tuple[dict, Any]:
  """``(base, head)``: ``head = params['head']``, base = every other entry."""
  base = {k: v for k, v in params.items() if k != "head"}
  return base, params["head"]


def merge_base_head(base: Mapping[str, Any], head: Any) -> dict:
  """Inverse of ``split_base_head``."""
  return {**base, "head": head}


__all__ = [
    "MODELS", "DEFAULT_INPUT_SHAPES", "get_model", "get_model_from_config",
    "model_kwargs", "init_params", "count_params", "split_base_head",
    "merge_base_head", "Model", "make_model", "as_model",
    "as_variables", "split_variables", "merge_variables", "stateless_apply",
    "require_stateless", "train_logits", "BNCNN", "MLP", "FedAvgCNN", "EMNISTCNN", "HARCNN", "LeNet5", "MnistCNN",
    "CifarCNN", "AlexNet28", "CifarResNet18", "TorchDense", "TorchConv", "torch_uniform_init", "CONV_IMPLS",
    "ResNet", "ResNet18", "ResNet8", "ResNet10", "variables_from_torch_state_dict",
    "torch_state_dict_from_variables", "load_pretrained",
]

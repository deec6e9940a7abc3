#!/usr/bin/env python
"""Converts a torchvision / PyTorch ResNet state_dict to flax variables (msgpack).

    python tools/convert_torchvision_resnet18.py resnet18_imagenet.pth resnet18_imagenet.msgpack

IN is a ``.pth`` / ``.pt`` (read with torch, imported only then) or an ``.npz`` of the state_dict's
arrays (no torch needed). OUT holds ``{"params", "batch_stats"}`` with the checkpoint's own head
(1000-way for ImageNet); ``fedjax_robust.models.resnet.load_pretrained`` later keeps the experiment's
freshly initialised head instead. See that module's docstring for the whole procedure (FedALC spec
§4.3, A20). ``--model resnet8|resnet10`` converts Fling checkpoints (``layers.0.0...`` names).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedjax_robust.models import count_params  # noqa: E402
from fedjax_robust.models.resnet import (LAYOUTS, RESNETS, read_state_dict,  # noqa: E402
                                         save_variables, variables_from_torch_state_dict)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("input", help="state_dict: .pth / .pt (needs torch) or .npz")
  parser.add_argument("output", help="flax msgpack file to write")
  parser.add_argument("--model", default="resnet18", choices=sorted(RESNETS))
  parser.add_argument("--layout", default=None, choices=LAYOUTS,
                      help="PyTorch naming (default: torchvision for resnet18, fling for resnet8/10)")
  args = parser.parse_args(argv)
  state_dict = read_state_dict(args.input)
  if "fc.weight" not in state_dict:
    raise SystemExit(f"{args.input}: no fc.weight in the state_dict; is it a ResNet checkpoint?")
  num_classes = int(state_dict["fc.weight"].shape[0])
  variables = variables_from_torch_state_dict(state_dict, args.model, num_classes, drop_head=False,
                                              layout=args.layout)
  save_variables(variables, args.output)
  print(f"{args.input} -> {args.output}: {args.model}, {count_params(variables['params']):,} parameters, "
        f"head {num_classes}-way")
  return 0


if __name__ == "__main__":
  sys.exit(main())

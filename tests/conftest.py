"""Shared pytest setup.

Four forced host devices let the ``shard_map`` strategy run (and be checked
against ``vmap``/sequential) on a CPU; the flag must be set before JAX starts.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

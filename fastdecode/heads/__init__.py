"""Trained parts that are not whole models: drafter heads, filters, one-step generators.

`base.py` is the contract (`Head`, `HeadConfig`, `Target`, `register_head`); `io.py` saves a head as
`model.safetensors` + `config.json` and loads it by folder or `zoo:<model>/<name>`. A head kind lives in its own file
here and registers itself when imported.
"""

from .base import Head, HeadConfig, Target, head_class, head_kinds, register_head
from .io import head_for, head_names, load_head, resolve_head, save_head

__all__ = ["Head", "HeadConfig", "Target", "head_class", "head_for", "head_kinds", "head_names", "load_head",
           "register_head", "resolve_head", "save_head"]

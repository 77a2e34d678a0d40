from .causal import CausalLM
from .diffusion import MaskedDiffusionLM
from .loading import load

__all__ = ["CausalLM", "MaskedDiffusionLM", "load"]

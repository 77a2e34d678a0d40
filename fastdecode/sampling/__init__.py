from .processors import min_p, repetition_penalty, temperature, top_k, top_p
from .samplers import greedy, sample

__all__ = ["greedy", "min_p", "repetition_penalty", "sample", "temperature", "top_k", "top_p"]
